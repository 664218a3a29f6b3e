"""Replicas under a running writer (issue 34): `canopy watch --publish` on an S3-compatible
server with two `canopy serve --http --index-uri` replicas, a change every few seconds for
minutes; no replica may serve a removed canary past the revocation bound, and deleted text
must leave the bucket and the replicas' caches `grace_s` after its deletion was published.

    python benchmarks/replica_watch.py                            # 5 minutes, a change every 4 s
    nice -n 10 python benchmarks/replica_watch.py --out benchmarks/results/replica_watch.json
    python benchmarks/replica_watch.py --minutes 1 --every 3      # a quick look

Set-up, all on 127.0.0.1: moto's S3 server (`python -m moto.server`, a process of its own);
the examples' 17 documents with an access policy (`restricted/**` readable by no one the
replicas answer for), `[storage] tidy = "inline"`, `keep_versions_s = 0` (the writer's index
has no readers of its own) and `[publish] grace_s = --grace`; the writer
`python -m canopy.server.cli watch DOCS --publish s3://BUCKET/docs`; two replicas
`serve --http --index-uri ... --principal alice` with `[publish] poll_s = --poll` and
`revocation_bound_s = --bound`. Builtin offline provider throughout.

For --minutes an editor runs a cycle of changes, one every --every s: add a canary document
(a made-up company whose name, a token such as "Zorvex007Quill", appears nowhere else), edit a
random regular document, delete the oldest canary, add one, edit, move the oldest canary into
`restricted/` (a revocation for alice: the text stays in the index for others). Meanwhile:
- a prober asks each replica's REST API (`POST /api/v1/basic_search`, the same tools as MCP)
  for each canary added or removed within the last bound + 60 s, round after round, and notes
  whether the answer (its citations and answer text, not the echoed query) holds the token;
- a manifest follower lists the bucket's manifests every 0.5 s and reads each new one's
  files (canopy.server.wings.publish.replica_cache, in a cache of its own) to learn which
  canaries it serves, which tokens its files hold, and when the writer wrote it (`published_at`;
  same machine, same clock);
- a scanner lists every object of the bucket every 2 s (boto3; content-addressed objects are
  read once) and every file under both replicas' caches, and notes which canary tokens they
  hold, as someone holding all of them would read them: every page record opened with every
  key any page map there holds (canopy.server.wings.publish.pagestore), every other file as it is;
- a sampler records the RSS of the writer's and each replica's process tree every 5 s.
After the changes stop it waits --grace + 20 s (so the last deletions' grace periods end) and
reports, per removed canary and replica, the revocation delay (first answer without it, after
which none had it, minus the writer's time for the first manifest without it), every answer
that held it later than the bound (must be none), publish sizes per generation (the writer's
log lines), when each deleted canary's token had left every published byte and every cached
byte (against its deleting manifest and against the first manifest whose files hold none of
it, next to grace_s), memory slopes, and errors (REST
answers other than 200, failed requests, ERROR or Traceback lines in the writer's or the
replicas' logs). JSON to --out.

What the byte scans can miss: Lance compresses large data pages, where a token would not be
seen; the examples' tables are small, and the scans check that each canary was seen in some
search-table object while it was live (`seen_in_lance`). That the probes see canaries at all
is checked too: how many published canaries each replica served at least once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from growth_bench import HERE_REPO, RESULTS, child_env, machine  # beside this script
from growth_serve import descendants, free_port, status_kb

AWS = {"AWS_ACCESS_KEY_ID": "canopy-bench", "AWS_SECRET_ACCESS_KEY": "canopy-bench-secret",
       "AWS_REGION": "us-east-1"}
PREFIX = "docs"
CYCLE = ("add", "edit", "delete", "add", "edit", "move")
EDITABLE = ("overview.md", "projects/kestrel.md", "projects/tern.md", "suppliers/helio_cells.md",
            "people/team_directory.md", "finance/budget_2025.md")
PUBLISHED = re.compile(
    r"(?P<first>deletions and relabels first: )?Published generation (?P<generation>\d+) to "
    r"\S+ as manifest (?P<seq>\d+): (?P<files>\d+) files \((?P<total>[\d.]+ (?:MB|B))\), "
    r"uploaded (?P<uploaded_files>\d+) \((?P<uploaded>[\d.]+ (?:MB|B))\) in (?P<s>[\d.]+)s"
    r"(?:; the database: (?P<written>[\d,]+) of (?P<pages>[\d,]+) pages written "
    r"\((?P<database>[\d.]+ (?:MB|B))\))?"
    r"(?:; removed (?P<gc_manifests>\d+) superseded generations, (?P<gc_files>\d+) files)?")
SETTINGS = """
[acl]
default = ["public"]
[[acl.rules]]
glob = "restricted/**"
labels = ["restricted"]
[acl.principals]
alice = ["public"]

[storage]
tidy = "inline"
keep_versions_s = 0

[publish]
grace_s = {grace}
"""


def token(k: int) -> str:
    return f"Zorvex{k:03d}Quill"


def canary_text(k: int) -> str:
    t = token(k)
    return (f"# {t} Holdings\n\n{t} Holdings makes brass valves for Project Kestrel in "
            f"Varrowby. The chief engineer of {t} Holdings, Odalys Ferrant, signed the valve "
            f"contract in 2024. {t} ships every month.\n")


def size_bytes(text: str) -> int:
    number, unit = text.split()
    return int(float(number) * (1e6 if unit == "MB" else 1))


@dataclass
class Canary:
    k: int
    path: str  # relative to DOCS, where it was added
    added_at: float
    removed_at: float | None = None
    how: str = ""  # "delete" or "move"


@dataclass
class Run:
    """What every thread records (appended under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    canaries: dict[int, Canary] = field(default_factory=dict)
    manifests: dict[int, dict[str, Any]] = field(default_factory=dict)  # seq -> facts
    probes: list[tuple[float, int, int, bool]] = field(default_factory=list)  # t, replica, k
    rest_errors: list[str] = field(default_factory=list)
    seen: dict[str, dict[int, float]] = field(default_factory=dict)  # where -> k -> last seen
    scans: list[float] = field(default_factory=list)  # when each byte scan began
    seen_in_lance: set[int] = field(default_factory=set)
    samples: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


# ---- processes ---------------------------------------------------------------------------------


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listening on port {port}")


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AWS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=AWS["AWS_SECRET_ACCESS_KEY"],
                        region_name=AWS["AWS_REGION"])


def rss_mb(pid: int) -> float:
    return round(sum(status_kb(p, "VmRSS") for p in descendants(pid)) / 1024, 1)


# ---- followers ---------------------------------------------------------------------------------


def follow_manifests(run: Run, endpoint: str, bucket: str, cache: Path) -> None:
    """Record each new manifest: when it was written, which canaries it serves and which
    tokens its files hold (its database as assembled, its search-table files)."""
    import sqlite3

    from canopy.server.wings.publish.location import open_location
    from canopy.server.wings.publish.manifest import Manifest, manifest_path
    from canopy.server.wings.publish.replica_cache import (
        materialize,
        prune_cache,
        remove_generation,
    )
    from canopy.server.wings.publish.writer import published_seqs

    location = open_location(f"s3://{bucket}/{PREFIX}", endpoint_url=endpoint)
    while not run.stop.is_set():
        try:
            for seq in published_seqs(location):
                if seq in run.manifests:
                    continue
                manifest = Manifest.model_validate_json(location.get(manifest_path(seq)))
                folder, _ = materialize(location, manifest, cache)
                db = sqlite3.connect(folder / "canopy.sqlite")
                # Documents alice may read (the replicas answer for her): a move into
                # restricted/ is revoked when its labels change, before its path does.
                paths = {p for p, labels in db.execute("SELECT path, labels FROM documents")
                         if "restricted" not in json.loads(labels)}
                db.close()
                with run.lock:
                    ks = list(run.canaries)
                held = {k for path in folder.rglob("*") if path.is_file()
                        for k in _tokens(path.read_bytes(), ks)}
                remove_generation(cache, seq)
                prune_cache(cache, [manifest])
                with run.lock:
                    run.manifests[seq] = {
                        "seq": seq, "generation": manifest.generation,
                        "published_at": manifest.published_at, "paths": sorted(paths),
                        "files": len(manifest.files), "tokens": sorted(held),
                        "packs": len(manifest.files["canopy.sqlite"].packs)}
        except FileNotFoundError:  # collected between the listing and the read
            pass
        except Exception as exc:  # noqa: BLE001 - a benchmark records and goes on
            with run.lock:
                run.rest_errors.append(f"manifest follower: {exc}")
        run.stop.wait(0.5)


def _tokens(data: bytes, ks: list[int]) -> set[int]:
    return {k for k in ks if token(k).encode() in data}


class Readable:
    """The canary tokens a set of files reveals to someone holding all of them: every page
    record opened with every key that a page map among them holds, or a block such a map
    opens holds, every other file as it is (canopy.server.wings.publish.pagestore). Files are
    named by an identity that changes with their content (an object key, a cache file's inode,
    size and mtime): each is read once, and each record opened once."""

    def __init__(self) -> None:
        self.plain: dict[str, set[int]] = {}  # identity -> tokens, for files not packs or maps
        self.maps: dict[str, Any] = {}  # identity -> PageRoot, or PageMap (a page list)
        self.packs: dict[str, tuple[str, bytes]] = {}  # identity -> (sha256, bytes)
        self.blocks: dict[tuple[str, int], Any] = {}  # (pack, offset) -> entries
        self.records: dict[tuple[str, int], set[int]] = {}  # (pack, offset) -> tokens

    def tokens(self, files: dict[str, Callable[[], bytes | None]],
               ks: list[int]) -> tuple[set[int], set[int]]:
        """(tokens `files` reveal, tokens in their search-table files); `files` maps each
        identity to what reads its bytes (None: it is gone since it was listed)."""
        import hashlib

        from canopy.server.wings.publish.pagestore import (
            LIST_MAGIC,
            MAP_MAGIC,
            PACK_MAGIC,
            PageMap,
            PageRoot,
            open_block,
            open_record,
        )

        lance: set[int] = set()
        present = set()
        for ident, read in files.items():
            if ident in self.plain or ident in self.maps or ident in self.packs:
                present.add(ident)
                continue
            data = read()
            if data is None:
                continue
            present.add(ident)
            if data.startswith(PACK_MAGIC):
                self.packs[ident] = (hashlib.sha256(data).hexdigest(), data)
            elif data.startswith(MAP_MAGIC):
                self.maps[ident] = PageRoot.from_bytes(data)
            elif data.startswith(LIST_MAGIC):
                self.maps[ident] = PageMap.from_bytes(data)
            else:
                self.plain[ident] = _tokens(data, ks)
                if not data.startswith(b"SQLite format 3") and ".json" not in ident:
                    lance |= self.plain[ident]
        # What left (collected, or replaced) is read no more.
        self.plain = {i: v for i, v in self.plain.items() if i in present}
        self.maps = {i: v for i, v in self.maps.items() if i in present}
        self.packs = {i: v for i, v in self.packs.items() if i in present}
        packs = dict(self.packs.values())
        found = {k for v in self.plain.values() for k in v}

        def pages(entries: Any, table: dict[int, tuple[str, int]]) -> None:
            for e in entries:
                sha = table.get(int(e["pack"]), ("",))[0]
                at, n = int(e["offset"]), int(e["length"])
                if sha not in packs:
                    continue
                if (sha, at) not in self.records:
                    self.records[(sha, at)] = _tokens(
                        open_record(packs[sha][at:at + n], bytes(e["key"])), ks)
                found.update(self.records[(sha, at)])

        for held in self.maps.values():
            if isinstance(held, PageMap):
                pages(held.entries, held.packs)
                continue
            for e in held.blocks:
                sha = held.packs[int(e["pack"])][0]
                at, n = int(e["offset"]), int(e["length"])
                if sha not in packs:
                    continue
                if (sha, at) not in self.blocks:
                    self.blocks[(sha, at)] = open_block(packs[sha][at:at + n], bytes(e["key"]))
                pages(self.blocks[(sha, at)], held.packs)
        return found, lance


def scan_bytes(run: Run, endpoint: str, bucket: str, caches: list[Path]) -> None:
    """Record, every 2 s, which canary tokens the bucket and the replicas' caches reveal
    (module doc)."""
    client = s3_client(endpoint)
    bucket_view, cache_view = Readable(), Readable()

    def body(key: str) -> Callable[[], bytes | None]:
        def read() -> bytes | None:
            try:
                return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
            except client.exceptions.NoSuchKey:  # collected since the listing
                return None
        return read

    def cached_file(path: Path) -> Callable[[], bytes | None]:
        def read() -> bytes | None:
            try:
                return path.read_bytes()
            except FileNotFoundError:  # deleted since the listing
                return None
        return read

    while not run.stop.is_set():
        now = time.time()
        found: dict[str, set[int]] = {"bucket": set(), "caches": set()}
        with run.lock:
            ks = list(run.canaries)
        try:
            objects = {}
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for o in page.get("Contents", []):
                    if o["Key"].endswith(".json"):
                        continue  # a manifest: settings and file names, no document text
                    objects[o["Key"]] = body(o["Key"])  # blobs never change: read once
            found["bucket"], lance = bucket_view.tokens(objects, ks)
            with run.lock:
                run.seen_in_lance |= lance
            cached: dict[str, Callable[[], bytes | None]] = {}
            for cache in caches:
                # os.walk passes over folders deleted while it walks (a drained generation).
                for folder, _, names in os.walk(cache):
                    for name in names:
                        path = Path(folder) / name
                        try:
                            st = path.stat()
                        except FileNotFoundError:
                            continue
                        cached[f"{path}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"] = (
                            cached_file(path))
            found["caches"], _ = cache_view.tokens(cached, ks)
        except Exception as exc:  # noqa: BLE001 - a benchmark records and goes on
            with run.lock:
                run.rest_errors.append(f"scanner: {exc}")
            run.stop.wait(2.0)
            continue  # an incomplete scan is no scan
        with run.lock:
            run.scans.append(now)
            for where, tokens in found.items():
                for k in tokens:
                    run.seen.setdefault(where, {})[k] = now
        run.stop.wait(2.0)


async def probe(run: Run, ports: list[int], bound: float) -> None:
    """Ask each replica for each canary of interest, round after round (module doc)."""
    import httpx2

    async with httpx2.AsyncClient(timeout=30) as http:
        while not run.stop.is_set():
            now = time.time()
            with run.lock:
                watched = [c.k for c in run.canaries.values()
                           if now - (c.removed_at or c.added_at) < bound + 60]
            for i, port in enumerate(ports):
                for k in watched:
                    t = time.time()
                    try:
                        r = await http.post(f"http://127.0.0.1:{port}/api/v1/basic_search",
                                            json={"query": token(k), "k": 3})
                    except httpx2.HTTPError as exc:
                        with run.lock:
                            run.rest_errors.append(f"replica {i + 1}: {type(exc).__name__}")
                        continue
                    if r.status_code != 200:
                        with run.lock:
                            run.rest_errors.append(
                                f"replica {i + 1}: {r.status_code} {r.text[:200]}")
                        continue
                    body = r.json()
                    text = json.dumps([body.get("answer"), body.get("citations")])
                    with run.lock:
                        run.probes.append((t, i, k, token(k) in text))
            await asyncio.sleep(0.2)


def sample(run: Run, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    t0 = time.time()
    while not run.stop.is_set():
        row = {"t": round(time.time() - t0, 1),
               **{name: rss_mb(p.pid) for name, p in procs.items()}}
        with run.lock:
            run.samples.append(row)
        run.stop.wait(5.0)


# ---- the editor ------------------------------------------------------------------------------


def edit(run: Run, docs: Path, minutes: float, every: float) -> None:
    import random

    rng = random.Random(34)
    deadline = time.monotonic() + minutes * 60
    k = step = 0
    while time.monotonic() < deadline:
        action = CYCLE[step % len(CYCLE)]
        step += 1
        with run.lock:
            live = sorted((c for c in run.canaries.values() if c.removed_at is None),
                          key=lambda c: c.k)
        if action == "add":
            k += 1
            rel = f"canaries/canary_{k:03d}.md"
            (docs / "canaries").mkdir(exist_ok=True)
            (docs / rel).write_text(canary_text(k), encoding="utf-8")
            with run.lock:
                run.canaries[k] = Canary(k, rel, time.time())
        elif action == "edit":
            target = docs / rng.choice(EDITABLE)
            with target.open("a", encoding="utf-8") as fh:
                fh.write(f"\n\nA note of {time.strftime('%H:%M:%S')} was added by the editors.\n")
        elif live:
            oldest = live[0]
            if action == "delete":
                (docs / oldest.path).unlink()
            else:
                (docs / "restricted").mkdir(exist_ok=True)
                (docs / oldest.path).rename(docs / "restricted" / Path(oldest.path).name)
            with run.lock:
                oldest.removed_at, oldest.how = time.time(), action
        time.sleep(max(0.0, every - 0.01))


# ---- analysis ----------------------------------------------------------------------------------


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope (per minute) of (seconds, value) points."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return round(60 * sum((x - mx) * (y - my) for x, y in points) / var, 2) if var else None


def analyse(run: Run, args: argparse.Namespace, logs: dict[str, Path]) -> dict[str, Any]:
    manifests = [run.manifests[s] for s in sorted(run.manifests)]
    removed = []
    violations = []
    for c in sorted(run.canaries.values(), key=lambda c: c.k):
        if c.removed_at is None:
            continue
        after = [m for m in manifests if m["published_at"] >= c.removed_at]
        gone = next((m for m in after if c.path not in m["paths"]), None)
        row: dict[str, Any] = {"canary": c.k, "how": c.how, "removed_at": c.removed_at,
                               "manifest": gone and gone["seq"]}
        if gone is not None:
            row["publish_after_change_s"] = round(gone["published_at"] - c.removed_at, 2)
            for i in range(len(args.ports)):
                probes = [(t, ok) for t, r, k, ok in run.probes
                          if r == i and k == c.k and t >= c.removed_at]
                held = [t for t, ok in probes if ok]
                last = max(held, default=None)
                first_without = min((t for t, ok in probes
                                     if not ok and (last is None or t > last)), default=None)
                if first_without is not None:
                    row[f"replica{i + 1}_delay_s"] = round(first_without - gone["published_at"],
                                                           2)
                late = [t for t in held if t > gone["published_at"] + args.bound]
                violations += [{"canary": c.k, "replica": i + 1,
                                "s_after_manifest": round(t - gone["published_at"], 2)}
                               for t in late]
            if c.how == "delete":
                # Gone between the last scan that saw it and the next one: the latter is
                # reported (an upper bound, 2 s resolution), from the deleting manifest and
                # from the first manifest none of whose files holds the token (its database as
                # its own page map opens it, its search-table files): from its publish on,
                # only superseded manifests name what reveals it.
                clean = next((m for m in after if m["seq"] >= gone["seq"]
                              and c.k not in m["tokens"]), None)
                row["clean_manifest"] = clean and clean["seq"]
                for where in ("bucket", "caches"):
                    last_seen = run.seen.get(where, {}).get(c.k)
                    clear = next((t for t in run.scans if last_seen is not None
                                  and t > last_seen), None)
                    row[f"{where}_clear_s"] = (None if clear is None else
                                               round(clear - gone["published_at"], 1))
                    row[f"{where}_still_held"] = last_seen is not None and clear is None
                    if clean is not None and clear is not None:
                        row[f"{where}_clear_after_clean_s"] = round(
                            clear - clean["published_at"], 1)
        removed.append(row)
    publishes = []
    for line in logs["writer"].read_text(errors="replace").splitlines():
        m = PUBLISHED.search(line)
        if m:
            publishes.append({
                "manifest": int(m["seq"]), "generation": int(m["generation"]),
                "kind": "revocation" if m["first"] else "update",
                "database_pages": int((m["pages"] or "0").replace(",", "")),
                "database_written": int((m["written"] or "0").replace(",", "")),
                "database_bytes": size_bytes(m["database"]) if m["database"] else 0,
                "files": int(m["files"]), "total_bytes": size_bytes(m["total"]),
                "uploaded_files": int(m["uploaded_files"]),
                "uploaded_bytes": size_bytes(m["uploaded"]), "seconds": float(m["s"]),
                "collected_files": int(m["gc_files"] or 0)})
    bad_lines = {name: [ln for ln in path.read_text(errors="replace").splitlines()
                        if "ERROR" in ln or "Traceback" in ln]
                 for name, path in logs.items()}
    half = args.minutes * 30
    memory = {}
    for name in logs:
        points = [(s["t"], s[name]) for s in run.samples if name in s]
        memory[name] = {
            "first_mb": points[0][1] if points else None,
            "last_mb": points[-1][1] if points else None,
            "slope_first_half_mb_min": slope([p for p in points if p[0] < half]),
            "slope_second_half_mb_min": slope([p for p in points if half <= p[0] <= 2 * half])}
    # That the probes can see a canary at all (else "no answer held it late" says nothing):
    # how many of the published canaries each replica served at least once. A share of probes
    # "live for a whole bound" says nothing when canaries live less than the bound (the
    # default cycle removes one 16-20 s after it was added, under the 30 s bound).
    published = {c.k for c in run.canaries.values()
                 if any(c.path in m["paths"] for m in manifests)}
    live_found = {}
    for i in range(len(args.ports)):
        served = {k for _, r, k, ok in run.probes if r == i and ok}
        live_found[f"replica{i + 1}"] = f"{len(served & published)} of {len(published)}"
    delays = {f"replica{i + 1}": sorted(r[f"replica{i + 1}_delay_s"] for r in removed
                                         if f"replica{i + 1}_delay_s" in r)
              for i in range(len(args.ports))}
    return {"removed": removed, "violations": violations, "publishes": publishes,
            "delays": {name: {"n": len(v), "min": v[0] if v else None,
                              "median": v[len(v) // 2] if v else None,
                              "max": v[-1] if v else None} for name, v in delays.items()},
            "erasure": _erasure(removed, args.grace), "memory": memory,
            "errors": {"requests": run.rest_errors, "log_lines": bad_lines},
            "probes": len(run.probes), "live_canaries_found": live_found,
            "seen_in_lance": sorted(run.seen_in_lance),
            "canaries": len(run.canaries), "manifests": len(manifests)}


def _erasure(removed: list[dict[str, Any]], grace: float) -> dict[str, Any]:
    out: dict[str, Any] = {"grace_s": grace}
    for where in ("bucket", "caches"):
        for suffix in ("clear_s", "clear_after_clean_s"):
            values = sorted(r[f"{where}_{suffix}"] for r in removed
                            if r.get(f"{where}_{suffix}") is not None)
            out[f"{where}_{suffix}"] = {"n": len(values), "min": values[0] if values else None,
                                        "max": values[-1] if values else None}
    out["never_cleared"] = [r["canary"] for r in removed
                            if r.get("bucket_still_held") or r.get("caches_still_held")]
    return out


# ---- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--every", type=float, default=4.0, help="seconds between changes")
    parser.add_argument("--grace", type=float, default=60.0, help="[publish] grace_s")
    parser.add_argument("--bound", type=float, default=30.0, help="revocation_bound_s")
    parser.add_argument("--poll", type=float, default=2.0, help="replicas' poll_s")
    parser.add_argument("--repo", type=Path, default=HERE_REPO, help="checkout to run")
    parser.add_argument("--out", type=Path, default=RESULTS / "replica_watch.json")
    args = parser.parse_args()
    sys.path.insert(0, str(args.repo))
    os.environ.update(AWS)  # this process reads the bucket too (the manifest follower)
    work = Path(tempfile.mkdtemp(prefix="canopy-replica-watch-"))
    docs, index = work / "docs", work / "index"
    shutil.copytree(args.repo / "examples" / "docs", docs)
    (docs / "canopy.toml").write_text(SETTINGS.format(grace=args.grace), encoding="utf-8")
    s3_port = free_port()
    endpoint = f"http://127.0.0.1:{s3_port}"
    env = {**child_env(args.repo), **AWS, "AWS_ENDPOINT_URL": endpoint}
    canopy = [sys.executable, "-m", "canopy.server.cli"]
    logs = {"writer": work / "writer.log", "replica1": work / "replica1.log",
            "replica2": work / "replica2.log"}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    moto = start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
                 env, work / "moto.log")
    run = Run()
    try:
        wait_for_port(s3_port, moto, timeout=60)
        bucket = "canopy-bench"
        s3_client(endpoint).create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/{PREFIX}"
        procs["writer"] = start([*canopy, "watch", str(docs), "--index-dir", str(index),
                                 "--publish", uri], env, logs["writer"])
        args.ports = [free_port(), free_port()]
        caches = [work / "cache1", work / "cache2"]
        for i, (port, cache) in enumerate(zip(args.ports, caches, strict=True)):
            procs[f"replica{i + 1}"] = start(
                [*canopy, "serve", "--http", "--port", str(port), "--index-uri", uri,
                 "--principal", "alice"],
                {**env, "CANOPY_PUBLISH__POLL_S": str(args.poll),
                 "CANOPY_PUBLISH__REVOCATION_BOUND_S": str(args.bound),
                 "CANOPY_PUBLISH__CACHE_DIR": str(cache)}, logs[f"replica{i + 1}"])
        for i, port in enumerate(args.ports):
            wait_for_port(port, procs[f"replica{i + 1}"], timeout=180)
        import httpx2

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all(
                _ready(httpx2, port) for port in args.ports):
            time.sleep(1)
        print(f"writer and replicas up ({work}); changes for {args.minutes:g} min, one every "
              f"{args.every:g} s", flush=True)
        threads = [threading.Thread(target=follow_manifests, daemon=True,
                                    args=(run, endpoint, bucket, work / "follower-cache")),
                   threading.Thread(target=scan_bytes, daemon=True,
                                    args=(run, endpoint, bucket, caches)),
                   threading.Thread(target=sample, daemon=True, args=(run, procs))]
        for t in threads:
            t.start()
        prober = threading.Thread(target=asyncio.run, args=(probe(run, args.ports, args.bound),),
                                  daemon=True)
        prober.start()
        edit(run, docs, args.minutes, args.every)
        settle = args.grace + 20
        print(f"changes done ({len(run.canaries)} canaries); {settle:g} s for the last grace "
              "periods to end", flush=True)
        time.sleep(settle)
        run.stop.set()
        for t in [*threads, prober]:
            t.join(timeout=60)
    finally:
        for proc in procs.values():
            stop(proc)
        stop(moto)
    report = {"machine": machine(args.repo), "args": {k: (str(v) if isinstance(v, Path) else v)
                                                     for k, v in vars(args).items()},
              **analyse(run, args, logs),
              "raw": {"manifests": run.manifests, "samples": run.samples,
                      "canaries": [vars(c) for c in run.canaries.values()]}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print_summary(report)
    print(f"JSON: {args.out}; logs: {work}")


def _ready(httpx2: Any, port: int) -> bool:
    try:
        return httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    except httpx2.HTTPError:
        return False


def publish_kinds(publishes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The publishes by kind: the first generation, revocation generations (an update's
    deletions and relabels, published before it regenerates), updates."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for i, p in enumerate(publishes):
        kind = ("first generation" if i == 0 else
                "revocation generation" if p["kind"] == "revocation" else "update")
        kinds.setdefault(kind, []).append(p)
    return kinds


def print_summary(r: dict[str, Any]) -> None:
    print(f"\n{r['canaries']} canaries, {r['manifests']} manifests, {r['probes']} probes; "
          f"published canaries each replica served at least once: "
          f"{r['live_canaries_found']}")
    print("revocation delay after the manifest without it (s):")
    for name, d in r["delays"].items():
        print(f"  {name}: n={d['n']} min={d['min']} median={d['median']} max={d['max']}")
    print(f"answers holding a removed canary later than the bound: {len(r['violations'])}")
    e = r["erasure"]
    print(f"deleted text gone (grace_s {e['grace_s']:g}; the scan after the last that saw it, "
          f"every 2 s), seconds after its deleting manifest / after the first manifest none of "
          f"whose files holds it:")
    for where in ("bucket", "caches"):
        print(f"  {where}: {e[f'{where}_clear_s']} / {e[f'{where}_clear_after_clean_s']}")
    print(f"  deleted canaries never seen gone: {e['never_cleared']}")
    print("publishes (manifest, kind, database pages written / pages, database bytes, "
          "uploaded / total bytes, seconds):")
    for p in r["publishes"]:
        print(f"  {p['manifest']:4d} g{p['generation']:<4d} {p['kind']:10s} "
              f"{p['database_written']:>5d} / {p['database_pages']:<5d} "
              f"{p['database_bytes']:>9,d}  {p['uploaded_bytes']:>10,d} / "
              f"{p['total_bytes']:>10,d}  {p['seconds']:.2f}")
    print(f"\n| publishes ({len(r['publishes'])}) | n | database pages written (median) | "
          "database MB (min / median / max) | uploaded MB (min / median / max) | "
          "s (median / max) |\n|---|---|---|---|---|---|")
    for kind, rows in publish_kinds(r["publishes"]).items():
        def mb(key: str, rows: list[dict[str, Any]] = rows) -> str:
            v = sorted(x[key] / 1e6 for x in rows)
            return f"{v[0]:.2f} / {v[len(v) // 2]:.2f} / {v[-1]:.2f}"

        secs = sorted(x["seconds"] for x in rows)
        pages = sorted(x["database_written"] for x in rows)
        print(f"| {kind} | {len(rows)} | {pages[len(pages) // 2]} of "
              f"{rows[-1]['database_pages']} | {mb('database_bytes')} | {mb('uploaded_bytes')} "
              f"| {secs[len(secs) // 2]:.2f} / {secs[-1]:.2f} |")
    print("memory (MB, first -> last; slope MB/min first half, second half):")
    for name, m in r["memory"].items():
        print(f"  {name}: {m['first_mb']} -> {m['last_mb']}; {m['slope_first_half_mb_min']}, "
              f"{m['slope_second_half_mb_min']}")
    errors = r["errors"]
    print(f"errors: {len(errors['requests'])} requests, "
          + ", ".join(f"{k} {len(v)} log lines" for k, v in errors["log_lines"].items()))
    for line in (errors["requests"][:5]
                 + [ln for v in errors["log_lines"].values() for ln in v][:10]):
        print(f"  {line}")


if __name__ == "__main__":
    main()

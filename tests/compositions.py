"""Update compositions (issue 30): random edits, appends, renames, moves between folders,
deletions, additions and policy edits, applied to a small corpus in random batch groupings, each
batch one `build_index`; after each, a check that every served artifact's units are readable by
the caller under the policy in force, and at the end that the index equals a fresh build of the
final state, access classes included.

The truth is computed here, not by canopy's policy code: folder rules and per-file rules are
interpreted by `PolicyModel.labels_for`, so a mutation of canopy's rules is seen as a
disagreement. Used by tests/test_update_compositions.py (bounded, in the default suite) and by
benchmarks/compositions_bench.py (a longer profile)."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canopy.server.runtime import Workspace, build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.store import Store
from canopy.store.export import Graph, load_graph

LABELS = ("staff", "x", "y")
FOLDERS = ("pub", "fx", "fy")
PRINCIPALS: dict[str, tuple[str, ...]] = {
    "admin": LABELS, "staff": ("staff",), "ax": ("staff", "x"), "oy": ("y",), "nobody": (),
}
# Sentences naming entities the builtin extractor finds; shared across documents, so entities,
# relationships and communities mix units of several access classes (served as views).
SENTENCES = (
    "Maria Okafor met Tomas Reyes of Bluewater Logistics in Porto.",
    "Helio Cells Ltd ships battery cells to Northwind Robotics in Sheffield.",
    "Sofia Brandt audited Helio Cells Ltd with Daniel Ferreira in Rotterdam.",
    "Priya Raman leads Project Kestrel at Northwind Robotics in Eindhoven.",
    "Bluewater Logistics moved the Kestrel parts from Rotterdam to Porto.",
    "Jonas Lindqvist reviewed Project Tern with Maria Okafor in Lisbon.",
    "Daniel Ferreira signed the Tern contract with Bluewater Logistics.",
    "Tomas Reyes told Priya Raman that Helio Cells Ltd would expand.",
    # claims (the builtin extractor's cues: sued, recall, fined)
    "Helio Cells Ltd sued Bluewater Logistics in Sheffield on 14 January 2025.",
    "Northwind Robotics announced a recall of Project Tern packs with Helio Cells Ltd.",
    "Regulators fined Bluewater Logistics after Daniel Ferreira reported the delays.",
)
EXTRACT = {"claims": True, "max_gleanings": 0}
# Units of about a paragraph: an edit keeps a document's other units (what finding 1 needs).
CHUNKING = {"chunk_tokens": 50, "overlap_tokens": 10}


@dataclass(frozen=True)
class PolicyModel:
    """An [acl] policy as the test means it: per-file rules first, then one rule per folder
    (`folder/**`), then the default."""

    folders: tuple[tuple[str, tuple[str, ...]], ...]
    files: tuple[tuple[str, tuple[str, ...]], ...] = ()
    default: tuple[str, ...] = ("staff",)

    def labels_for(self, path: str) -> tuple[str, ...]:
        for rule, labels in self.files:
            if rule == path:
                return labels
        for folder, labels in self.folders:
            if path.startswith(folder + "/"):
                return labels
        return self.default

    def toml(self) -> str:
        lines = ["[acl]", f"default = {json.dumps(list(self.default))}", ""]
        for glob, labels in [*self.files, *((f"{f}/**", labs) for f, labs in self.folders)]:
            lines += ["[[acl.rules]]", f"glob = {json.dumps(glob)}",
                      f"labels = {json.dumps(list(labels))}", ""]
        lines.append("[acl.principals]")
        lines += [f"{name} = {json.dumps(list(labs))}" for name, labs in PRINCIPALS.items()]
        return "\n".join(lines) + "\n"

    def readable(self, principal: str, path: str) -> bool:
        return bool(set(PRINCIPALS[principal]) & set(self.labels_for(path)))


def random_policy(rng: random.Random, files: list[str], pin: str | None) -> PolicyModel:
    """Folder rules drawn at random, `pin` (and maybe another file) given a rule of its own."""
    def labels() -> tuple[str, ...]:
        return tuple(sorted(rng.sample(LABELS, rng.choice([1, 1, 2]))))

    folders = tuple((f, ("staff",) if f == "pub" and rng.random() < 0.5 else labels())
                    for f in FOLDERS)
    pinned = {p: labels() for p in rng.sample(files, min(len(files), rng.randint(0, 1)))}
    if pin is not None:
        pinned[pin] = labels()
    return PolicyModel(folders, tuple(sorted(pinned.items())), ("staff",))


# ---- the corpus and its operations ------------------------------------------------------------


class Corpus:
    """A folder of small Markdown documents in FOLDERS, plus its canopy.toml."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.serial = 0
        self.policy = PolicyModel(tuple((f, (("staff",), ("x",), ("y",))[i])
                                        for i, f in enumerate(FOLDERS)))
        root.mkdir(parents=True)
        for folder in FOLDERS:
            for _ in range(2):
                self.add(folder)
        self.write_policy()

    def write_policy(self) -> None:
        (self.root / "canopy.toml").write_text(self.policy.toml(), encoding="utf-8")

    def files(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*.md"))

    def _paragraph(self) -> str:
        picked = self.rng.sample(SENTENCES, 2)
        self.serial += 1
        return f"{' '.join(picked)} Ledger entry {self.serial}."

    def add(self, folder: str) -> str:
        self.serial += 1
        path = f"{folder}/doc{self.serial}.md"
        body = "\n\n".join(self._paragraph() for _ in range(self.rng.randint(2, 4)))
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_text(f"# Note {self.serial}\n\n{body}\n", encoding="utf-8")
        return path

    def apply(self, op: tuple[Any, ...]) -> str:
        """Apply one operation; returns what it did (for failure messages). Operations name
        files by index into the current listing, so any sequence applies to any state."""
        kind = op[0]
        files = self.files()
        if kind == "add" or (not files and kind != "policy"):
            return "add " + self.add(FOLDERS[op[1] % len(FOLDERS)] if kind == "add" else "pub")
        if kind == "policy":  # ("policy", seed, index of a file to give a rule of its own)
            self.rng.seed(op[1])
            self.policy = random_policy(self.rng, files, files[op[2] % len(files)] if files
                                        else None)
            self.write_policy()
            return f"policy {self.policy}"
        path = files[op[1] % len(files)]
        target = self.root / path
        if kind == "edit":
            paras = target.read_text(encoding="utf-8").split("\n\n")
            i = 1 + op[2] % max(1, len(paras) - 1) if len(paras) > 1 else 0
            paras[i] = paras[i].rstrip("\n") + f" Revised {self.serial}: Sofia Brandt agreed."
            self.serial += 1
            target.write_text("\n\n".join(paras), encoding="utf-8")
        elif kind == "append":
            with target.open("a", encoding="utf-8") as f:
                f.write("\n" + self._paragraph() + "\n")
        elif kind == "rename":
            self.serial += 1
            new = target.with_name(f"renamed{self.serial}.md")
            target.rename(new)
            return f"rename {path} -> {new.relative_to(self.root).as_posix()}"
        elif kind == "move":
            folder = FOLDERS[op[2] % len(FOLDERS)]
            dst = self.root / folder / target.name
            if dst.exists():
                dst = dst.with_name(f"moved{self.serial}_{target.name}")
            self.serial += 1
            target.rename(dst)
            return f"move {path} -> {dst.relative_to(self.root).as_posix()}"
        elif kind == "delete":
            target.unlink()
        return f"{kind} {path}"


# ---- checks -----------------------------------------------------------------------------------


def workspace(docs: Path, index_dir: Path, **overrides: Any) -> Workspace:
    """The corpus's workspace: claims on, units of about a paragraph (plus `overrides`, e.g.
    an endpoint: `llm={"base_url": ...}`)."""
    return open_workspace(docs, index_dir=index_dir, **{"extract": EXTRACT, "chunking": CHUNKING,
                                                         **overrides})


def class_labels(index_dir: Path) -> dict[int, tuple[str, ...]]:
    store = Store(index_dir)
    try:
        with store.snapshot() as snap:
            return snap.acl_classes()
    finally:
        store.close()


def unit_classes(index_dir: Path) -> dict[str, int]:
    store = Store(index_dir)
    try:
        with store.snapshot() as snap:
            return dict(snap.db.execute("SELECT id, acl FROM text_units").fetchall())
    finally:
        store.close()


def search_rows(index_dir: Path) -> dict[str, dict[str, tuple[int, ...]]]:
    """(id -> ACL classes) of every row of each search table at its committed version."""
    import lancedb

    store = Store(index_dir)
    try:
        versions = json.loads(store.get_meta("lance_versions", "{}") or "{}")
    finally:
        store.close()
    db = lancedb.connect(str(index_dir / "lance"))
    out = {}
    for name, version in versions.items():
        t = db.open_table(name)
        t.checkout(int(version))
        rows = t.to_arrow().select(["id", "acl"]).to_pylist()
        out[name] = {r["id"]: tuple(sorted(r["acl"])) for r in rows}
    return out


def check_stored_access(index_dir: Path, policy: PolicyModel, context: str) -> Graph:
    """Every document and unit carries the class the policy gives its path; every search row
    of a unit carries its unit's class."""
    store = Store(index_dir)
    try:
        g = load_graph(store)
    finally:
        store.close()
    labels = class_labels(index_dir)
    classes = unit_classes(index_dir)
    for uid, unit in g.units.items():
        path = g.documents[unit.document_id].path
        assert labels[classes[uid]] == tuple(sorted(set(policy.labels_for(path)))), (
            context, path, uid, labels[classes[uid]], policy.labels_for(path))
    for doc in g.documents.values():
        assert doc.labels == tuple(sorted(set(policy.labels_for(doc.path)))), (context, doc.path)
    rows = search_rows(index_dir).get("text_units", {})
    assert set(rows) == set(g.units), (context, "search rows without a unit",
                                       set(rows) - set(g.units), "units without a search row",
                                       set(g.units) - set(rows))
    for uid, acl in rows.items():
        assert acl == (classes[uid],), (context, "search row", uid, acl, classes[uid])
    return g


def check_served(docs: Path, index_dir: Path, policy: PolicyModel, context: str, *,
                 complete: bool = True, **overrides: Any) -> int:
    """For every principal, through the serving reader: every unit, entity, relationship,
    claim and report it is served (canonical or view) derives only from units whose document
    the policy lets it read; search hits too; with `complete`, every unit it may read is
    served (not so while an update is under way). Returns how many artifacts were checked."""
    svc = CanopyService(workspace(docs, index_dir, **overrides))
    checked = 0
    try:
        g = load_graph(svc.store)
        path_of = {u: g.documents[unit.document_id].path for u, unit in g.units.items()}
        for who in PRINCIPALS:
            may = {u for u, p in path_of.items() if policy.readable(who, p)}
            checked += asyncio.run(_served_by(svc, who, g, may, f"{context} [{who}]",
                                              complete))
    finally:
        svc.close()
    return checked


async def _served_by(svc: CanopyService, who: str, g: Graph, may: set[str], context: str,
                     complete: bool) -> int:
    from canopy.acl.access import State

    def within(what: str, aid: str, units: Iterable[str]) -> None:
        bad = set(units) - may
        assert not bad, (context, what, aid, sorted(bad))

    with svc.context(who) as ctx:
        r = ctx.reader
        served_units = r.units(g.units)
        within("unit", "*", served_units)
        assert not complete or set(served_units) == may, (
            context, "readable units not served", sorted(may - set(served_units)))
        states = r.entity_states(g.entities)
        for eid, st in states.items():
            if st == State.FULL:
                within("entity", eid, g.entities[eid].text_unit_ids)
        entities = await r.entities([e for e, st in states.items() if st])
        for eid, e in entities.items():
            within("entity view", eid, e.text_unit_ids)
        rels = await r.relationships(g.relationships)
        for rid, rel in rels.items():
            within("relationship", rid, rel.text_unit_ids)
        for claim in r.claims_of(g.entities):
            within("claim", claim.id, claim.text_unit_ids)
        reports = await r.reports(g.communities)
        for cid, report in reports.items():
            within("report", cid, report.text_unit_ids)
        hits = 0
        query = "Ledger Maria Okafor Helio Cells"
        vector = await r.embed(query)
        for table in ("text_units", "entities", "reports"):
            for hit in await r.search(table, vector=vector, text=query, k=500):
                hits += 1
                if table == "text_units":
                    within("unit hit", hit.id, [hit.id])
                elif table == "entities":
                    assert hit.id in entities, (context, "entity hit not served", hit.id)
                    within("entity hit", hit.id, g.entities[hit.id].text_unit_ids)
                else:
                    assert hit.id in reports, (context, "report hit not served", hit.id)
                    within("report hit", hit.id, g.reports[hit.id].text_unit_ids)
    return len(served_units) + len(entities) + len(rels) + len(reports) + hits


def canonical_with_access(index_dir: Path) -> dict[str, Any]:
    """The index with document ids factored out (a rename keeps its id incrementally and gets
    a path-derived one in a fresh build), and every ACL class written as its labels: units by
    (path, text) with their class, artifacts with their provenance and the label sets of their
    gates, the search rows of units and entities with theirs."""
    store = Store(index_dir)
    try:
        g = load_graph(store)
        with store.snapshot() as snap:
            gates = {t: {r[0]: (tuple(json.loads(r[1])), r[2]) for r in snap.db.execute(
                f"SELECT {'id'}, acl, stale FROM {t}")}  # noqa: S608 - fixed table names
                for t in ("entities", "relationships", "claims")}
    finally:
        store.close()
    labels = class_labels(index_dir)
    classes = unit_classes(index_dir)
    key = {u.id: (g.documents[u.document_id].path, u.text) for u in g.units.values()}

    def names(acl: Iterable[int]) -> tuple[tuple[str, ...], ...]:
        return tuple(sorted(labels[a] for a in acl))

    def prov(ids: Iterable[str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(key[i] for i in ids))

    rows = search_rows(index_dir)
    return {
        "documents": sorted((d.path, d.content_hash, d.labels) for d in g.documents.values()),
        "units": sorted((*key[u], labels[classes[u]]) for u in g.units),
        "entities": sorted((e.id, e.name, e.type, e.description, e.degree, prov(e.text_unit_ids),
                            names(gates["entities"][e.id][0]), gates["entities"][e.id][1])
                           for e in g.entities.values()),
        "relationships": sorted((r.id, r.source, r.target, r.description, r.weight,
                                 prov(r.text_unit_ids), names(gates["relationships"][r.id][0]),
                                 gates["relationships"][r.id][1])
                                for r in g.relationships.values()),
        "claims": sorted((c.subject, c.object, c.type, c.status, c.description, c.quote,
                          prov(c.text_unit_ids), names(gates["claims"][c.id][0]),
                          gates["claims"][c.id][1]) for c in g.claims.values()),
        "unit_rows": sorted((*key[u], names(acl)) for u, acl in rows.get("text_units", {}).items()),
        "entity_rows": sorted((e, names(acl)) for e, acl in rows.get("entities", {}).items()),
    }


@dataclass
class Outcome:
    builds: int = 0
    checked: int = 0  # served artifacts checked, over every build and principal
    claims: int = 0  # claims in the final index (the check of claims is not vacuous)
    applied: list[str] = field(default_factory=list)


def run_composition(root: Path, seed: int, steps: list[tuple[tuple[Any, ...], bool]]) -> Outcome:
    """Build the corpus, apply `steps` ((operation, build after it) each; a build always
    follows the last), checking after every build; then compare with a fresh build."""
    corpus = Corpus(root / "docs", seed)
    ws_index = root / "index"
    out = Outcome()

    def build_and_check() -> None:
        build_index(workspace(corpus.root, ws_index))
        out.builds += 1
        context = f"seed {seed} after {out.applied}"
        check_stored_access(ws_index, corpus.policy, context)
        out.checked += check_served(corpus.root, ws_index, corpus.policy, context)

    build_and_check()
    for i, (op, flush) in enumerate(steps):
        out.applied.append(corpus.apply(op))
        if flush or i == len(steps) - 1:
            build_and_check()
    fresh = root / "fresh"
    build_index(workspace(corpus.root, fresh))
    got, want = canonical_with_access(ws_index), canonical_with_access(fresh)
    out.claims = len(got["claims"])
    for part in want:
        assert got[part] == want[part], (f"seed {seed} after {out.applied}: {part}",
                                         sorted(set(got[part]) ^ set(want[part]))[:6])
    shutil.rmtree(fresh)
    return out

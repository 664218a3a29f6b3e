"""An S3-compatible server (moto) on 127.0.0.1 for the publishing tests, and every byte a URI
stores, read as an attacker holding all of it would: every page record any stored page map
opens. Test modules import the fixtures they use
(`from tests.wings.publish.object_store import bucket, s3`)."""

from __future__ import annotations

import hashlib
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from canopy.server.wings.publish.pagestore import (
    LIST_MAGIC,
    MAP_MAGIC,
    PACK_MAGIC,
    PageMap,
    PageRoot,
    open_block,
    open_record,
)
from tests.conftest import require_heavy
from tests.net import free_port

AWS = {"AWS_ACCESS_KEY_ID": "canopy-test", "AWS_SECRET_ACCESS_KEY": "canopy-test-secret",
       "AWS_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1; yields its endpoint URL."""
    require_heavy("moto")  # the [heavy] extra: tests using it run under `pytest -m heavy`
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket; the AWS variables set for this process; yields its s3:// URI."""
    import boto3

    for key, value in {**AWS, "AWS_ENDPOINT_URL": s3}.items():
        monkeypatch.setenv(key, value)
    name = f"canopy-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3).create_bucket(Bucket=name)
    return f"s3://{name}/team-docs"


def stored_objects(uri: str) -> dict[str, bytes]:
    """Every object the store of `uri` holds, whole bucket or folder (not only the URI's
    prefix), every version of it, by key. S3 through boto3 (AWS_ENDPOINT_URL as set by
    `bucket`), so nothing of Canopy's own reading is trusted."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3":
        root = Path(uri)
        return {p.relative_to(root).as_posix(): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file()}
    import boto3

    client = boto3.client("s3")
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_object_versions").paginate(Bucket=parsed.netloc):
        for v in page.get("Versions", []):
            body = client.get_object(Bucket=parsed.netloc, Key=v["Key"],
                                     VersionId=v["VersionId"])["Body"].read()
            found[f"{v['Key']}@{v['VersionId']}"] = body
    return found


def readable(files: dict[str, bytes]) -> dict[str, bytes]:
    """The bytes a grep should see in each of `files`: a pack as it is plus its records opened
    with every key that any page map among `files` holds, or that a block such a map opens
    holds (a record no key opens stays ciphertext: what cryptographic erasure leaves); a page
    map or page list decompressed; any other file as it is."""
    packs = {hashlib.sha256(d).hexdigest(): d for d in files.values() if d.startswith(PACK_MAGIC)}
    keys: dict[str, set[tuple[int, int, bytes]]] = {}  # pack sha256 -> (offset, length, key)

    def add(entries: Any, table: dict[int, tuple[str, int]]) -> None:
        for e in entries:
            sha = table.get(int(e["pack"]), ("",))[0]
            keys.setdefault(sha, set()).add((int(e["offset"]), int(e["length"]), bytes(e["key"])))

    for data in files.values():
        if data.startswith(MAP_MAGIC):
            root = PageRoot.from_bytes(data)
            for e in root.blocks:
                sha = root.packs[int(e["pack"])][0]
                if sha in packs:
                    at, n = int(e["offset"]), int(e["length"])
                    add(open_block(packs[sha][at:at + n], bytes(e["key"])), root.packs)
        elif data.startswith(LIST_MAGIC):
            listed = PageMap.from_bytes(data)
            add(listed.entries, listed.packs)
    out = {}
    for name, data in files.items():
        if data.startswith(PACK_MAGIC):
            known = keys.get(hashlib.sha256(data).hexdigest(), set())
            out[name] = data + b"".join(open_record(data[at:at + n], key)
                                        for at, n, key in sorted(known))
        elif data.startswith((MAP_MAGIC, LIST_MAGIC)):
            out[name] = zlib.decompress(data[len(MAP_MAGIC if data.startswith(MAP_MAGIC)
                                                 else LIST_MAGIC):])
        else:
            out[name] = data
    return out


def holders(files: dict[str, bytes], needle: str) -> list[str]:
    """Keys of `files` whose readable bytes contain `needle` (UTF-8)."""
    data = needle.encode()
    return sorted(k for k, v in readable(files).items() if data in v)


def folder_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}

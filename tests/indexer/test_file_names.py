"""File names that are not UTF-8 (issue 9, case 5): Linux allows any byte but NUL and "/", and
one such name used to stop all indexing (`UnicodeEncodeError` hashing its path) and freeze
`watch`. Such a file is indexed under a lossless escaped form of its name, which stores as UTF-8
and keeps its folders, so ACL rules match it like any other path.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canopy.acl.policy import Policy
from canopy.indexer.loaders import LoadedDocument, scan_folder
from canopy.model import Skip
from canopy.settings import AclSettings, InputSettings

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux allows any name bytes")

# A name of arbitrary bytes, as Linux allows them: anything but NUL and "/", not "." or "..".
RAW_NAME = st.binary(min_size=1, max_size=40).map(
    lambda b: b.replace(b"\0", b"").replace(b"/", b"")
).filter(lambda b: b not in (b"", b".", b".."))


def _policy() -> Policy:
    return Policy(AclSettings(enabled=True, default=[], rules=[
        {"glob": "finance/**", "labels": ["finance"]}, {"glob": "**", "labels": ["staff"]}]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RAW_NAME, min_size=1, max_size=6, unique=True), RAW_NAME)
def test_any_byte_name_under_finance_is_indexed_once_under_the_finance_rule(names: list[bytes],
                                                                            folder: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.fsencode(tmp)
        os.makedirs(os.path.join(root, b"finance", folder))
        for n, name in enumerate(names):
            for parent in (b"finance", os.path.join(b"finance", folder)):
                with open(os.path.join(root, parent, name + b".txt"), "wb") as fh:
                    fh.write(f"document {n}".encode())
        found = list(scan_folder(Path(tmp), InputSettings(exclude=[])))
        docs = [d for d in found if isinstance(d, LoadedDocument)]
        assert not [s for s in found if isinstance(s, Skip)]
        assert len(docs) == 2 * len(names) == len({d.path for d in docs})  # lossless: no collisions
        for doc in docs:
            doc.path.encode("utf-8")  # storable as SQLite text, hashable by content_hash
            assert doc.path.startswith("finance/")
            assert _policy().labels_for(doc.path) == ("finance",)


@given(st.lists(RAW_NAME, min_size=2, max_size=8, unique=True))
def test_the_display_form_is_injective_utf8_and_identity_on_plain_names(names: list[bytes]) -> None:
    from canopy.indexer.listing import display_name

    shown = [display_name(n) for n in names]
    assert len(set(shown)) == len(names)
    for raw, text in zip(names, shown, strict=True):
        text.encode("utf-8")
        assert "/" not in text
        try:
            plain = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if "\\" not in plain:
            assert text == plain


def test_a_latin1_name_does_not_stop_indexing_or_later_updates(tmp_path: Path) -> None:
    from canopy.server.runtime import build_index, open_workspace
    from canopy.server.status import index_status
    from canopy.store import Store
    from canopy.store.export import load_graph

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "kestrel.txt").write_text("Maria Okafor leads Project Kestrel.")
    with open(os.path.join(os.fsencode(docs), b"r\xe9sum\xe9.txt"), "wb") as fh:
        fh.write(b"Tom Reyes leads Project Heron.")
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    (docs / "tern.txt").write_text("Ana Li leads Project Tern.")  # a later batch, as under watch
    result = build_index(ws)
    assert not result.skips
    store = Store(tmp_path / "idx")
    try:
        paths = sorted(d.path for d in load_graph(store).documents.values())
        assert index_status(store).documents == 3
    finally:
        store.close()
    assert paths == ["kestrel.txt", "r\\xe9sum\\xe9.txt", "tern.txt"]


def test_a_name_of_leading_dots_keeps_its_file_type(tmp_path: Path) -> None:
    """`....txt` is a text file (hypothesis found it skipped: os.path.splitext ignores leading
    dots), and listing and loading agree on a file's type."""
    from canopy.indexer.listing import file_suffix

    (tmp_path / "....txt").write_text("dots first")
    (tmp_path / "..notes.md").write_text("# Notes\n\ntwo dots")
    found = list(scan_folder(tmp_path, InputSettings(exclude=[])))
    assert sorted(d.path for d in found if isinstance(d, LoadedDocument)) == ["....txt",
                                                                             "..notes.md"]
    assert (file_suffix("a/....TXT"), file_suffix(".txt"), file_suffix("a.")) == (".txt", "", "")

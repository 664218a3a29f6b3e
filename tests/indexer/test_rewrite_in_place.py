"""A document rewritten in place (truncated, then written: Python's `write_text`, shell `>`, many
editors) is never indexed from the empty moment in between. The soak benchmark found it: an
update that read the file then dropped the document, and `serve --watch` stopped serving it for
about ten seconds, until the next update put it back."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from canopy.indexer import listing
from canopy.indexer.loaders import LoadedDocument, scan_folder
from canopy.model import Skip
from canopy.server.api import Index
from canopy.settings import InputSettings

TEXT = "# Harbor log\n\nThe harbor master Ada Quill logged the Quorvexian freighter at dawn.\n"


def _rewrite_later(path: Path, text: str, after_s: float) -> threading.Thread:
    """Truncate `path` now and write `text` into it `after_s` later, as a slow writer would."""
    path.write_bytes(b"")

    def write() -> None:
        time.sleep(after_s)
        with path.open("r+b") as fh:
            fh.write(text.encode())

    t = threading.Thread(target=write)
    t.start()
    return t


def test_a_file_read_between_truncation_and_write_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "log.md"
    writer = _rewrite_later(path, TEXT, 0.15)
    items = list(scan_folder(tmp_path, InputSettings()))
    writer.join()
    assert [type(i) for i in items] == [LoadedDocument]
    assert "Quorvexian freighter" in items[0].text  # type: ignore[union-attr]


def test_a_file_that_stays_empty_is_still_a_skip_once_it_settled(tmp_path: Path) -> None:
    (tmp_path / "empty.md").write_bytes(b"")
    t0 = time.monotonic()
    items = list(scan_folder(tmp_path, InputSettings()))
    assert [(type(i), getattr(i, "reason", "")) for i in items] == [(Skip, "no text content")]
    assert time.monotonic() - t0 < listing.SETTLE_S + 1.0  # one wait, not one per read
    old = time.time() - 60  # emptied long ago: no wait at all
    os.utime(tmp_path / "empty.md", (old, old))
    t0 = time.monotonic()
    list(scan_folder(tmp_path, InputSettings()))
    assert time.monotonic() - t0 < listing.SETTLE_S / 2


def test_an_update_during_a_rewrite_keeps_the_document(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "log.md").write_text(TEXT.replace("at dawn", "at noon"), encoding="utf-8")
    canopy = Index.open(docs, index_dir=tmp_path / "idx")
    canopy.update()
    writer = _rewrite_later(docs / "log.md", TEXT, 0.2)
    run = canopy.update()
    writer.join()
    assert run.stats["documents"] == 1 and not run.skips
    found = canopy.basic_search("Quorvexian freighter", k=3)
    assert [c.document for c in found.citations if c.kind == "text_unit"] == ["log.md"]
    assert "at dawn" in found.context and "at noon" not in found.context

"""Markdown front matter: parsed into a document title and metadata that head every text unit
in search and context, updated without re-extraction; and the PDF loader."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pytest

from canopy.indexer.loaders import front_matter, load_file, metadata_pairs, scan_folder
from canopy.server.engines import basic_search, local_search, source_span
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.settings import InputSettings
from canopy.store import Store
from canopy.store.export import load_graph

ARTICLE = """---
title: "Harbour cranes return to Tallinn"
source: Nordwind Gazette
published_at: 2023-10-06T21:31:00+00:00
author: [Liis Tamm, Ott Kask]
url: https://example.org/cranes
draft: false
extra: {nested: 1}
---
# Harbour cranes

{body}
"""


def _paragraphs(n: int, topic: str) -> str:
    return "\n\n".join(
        f"Paragraph {i} on {topic}: the port authority moved {i} container cranes along the quay, "
        f"and the dock workers' union discussed shift {i} with Kalev Shipping in detail."
        for i in range(n))


class TestFrontMatter:
    def test_fields_are_parsed_and_rendered_for_search(self) -> None:
        fields, body = front_matter(ARTICLE.replace("{body}", "Body."))
        assert body == "# Harbour cranes\n\nBody.\n"
        assert fields["title"] == "Harbour cranes return to Tallinn"
        assert metadata_pairs(fields) == (
            ("source", "Nordwind Gazette"),
            ("published_at", "October 6, 2023"),  # as people ask: "the October 6, 2023 report"
            ("author", "Liis Tamm, Ott Kask"),
        )  # not the title, a link, a flag or a nested mapping

    def test_a_field_list_keeps_only_those_fields(self) -> None:
        fields, _ = front_matter(ARTICLE.replace("{body}", "Body."))
        assert metadata_pairs(fields, ["Source", "date"]) == (("source", "Nordwind Gazette"),)

    def test_long_values_are_cut_and_dates_written_out(self) -> None:
        pairs = metadata_pairs({"summary": "word " * 100, "day": dt.date(2024, 2, 29), "n": 3,
                                "quoted": "2023-11-27T08:45:59+00:00", "code": "2023-13-99"})
        assert pairs[0][1].endswith("…") and len(pairs[0][1]) <= 201
        assert pairs[1:] == (("day", "February 29, 2024"), ("n", "3"),
                             ("quoted", "November 27, 2023"), ("code", "2023-13-99"))

    @pytest.mark.parametrize("text", [
        "---\ntitle: [unclosed\n---\nBody.",  # invalid YAML
        "---\njust a sentence between rules\n---\nBody.",  # YAML, but not a mapping
        "Body first.\n---\ntitle: x\n---\n",  # not at the start
    ])
    def test_anything_else_stays_text(self, text: str) -> None:
        assert front_matter(text) == ({}, text)

    def test_scan_takes_the_title_from_front_matter_and_only_reads_markdown(
        self, tmp_path: Path
    ) -> None:
        (tmp_path / "a.md").write_text(ARTICLE.replace("{body}", "Body."), encoding="utf-8")
        (tmp_path / "b.txt").write_text("---\ntitle: Not front matter in a .txt\n---\nText.",
                                        encoding="utf-8")
        (tmp_path / "c.md").write_text("---\ntitle: Only metadata\n---\n", encoding="utf-8")
        docs = {d.path: d for d in scan_folder(tmp_path, InputSettings())}
        assert docs["a.md"].title == "Harbour cranes return to Tallinn"
        assert docs["a.md"].text.startswith("# Harbour cranes")
        assert dict(docs["a.md"].metadata)["source"] == "Nordwind Gazette"
        assert docs["b.txt"].metadata == () and docs["b.txt"].text.startswith("---")
        assert docs["c.md"].reason == "no text content"  # a Skip: nothing to index
        off = {d.path: d for d in scan_folder(tmp_path, InputSettings(front_matter=False))}
        assert off["a.md"].metadata == () and off["a.md"].text.startswith("---")


def test_metadata_heads_every_unit_in_search_context_and_sources(tmp_path: Path) -> None:
    """The source name occurs only in the front matter of a three-unit article; every unit is
    found by it, context blocks and source spans carry it, and editing it re-embeds without
    re-extracting anything."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "cranes.md").write_text(ARTICLE.replace("{body}", _paragraphs(24, "cranes")),
                                    encoding="utf-8")
    (docs / "other.md").write_text(
        "# Grain exports\n\n" + _paragraphs(6, "grain"), encoding="utf-8"
    )
    (docs / "canopy.toml").write_text("[chunking]\nchunk_tokens = 300\noverlap_tokens = 20\n",
                                      encoding="utf-8")
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    store = Store(ws.index_dir)
    try:
        g = load_graph(store)
        cranes = next(d for d in g.documents.values() if d.path == "cranes.md")
        units = [u for u in g.units.values() if u.document_id == cranes.id]
    finally:
        store.close()
    assert len(units) >= 3 and "Nordwind" not in "".join(u.text for u in units)
    assert dict(cranes.metadata)["published_at"] == "October 6, 2023"

    svc = CanopyService(ws)
    try:
        with svc.context(None) as ctx:
            hits = asyncio.run(ctx.reader.search("text_units", vector=None,
                                                 text="Nordwind Gazette", k=20))
        assert {u.id for u in units} <= {h.id for h in hits}

        result = asyncio.run(svc.run(None, lambda c: basic_search(
            c, "What did the Nordwind Gazette report?", k=3)))
        cited = [c for c in result.citations if c.kind == "text_unit"]
        assert cited and all(c.document == "cranes.md" for c in cited)
        assert "source: Nordwind Gazette · published_at: October 6, 2023" in result.context

        local = asyncio.run(svc.run(None, lambda c: local_search(
            c, "Nordwind Gazette cranes on the quay")))
        assert "(source: Nordwind Gazette" in local.context
        with svc.context(None) as ctx:
            span = source_span(ctx, units[-1].id)
        assert span.metadata == {"source": "Nordwind Gazette", "published_at": "October 6, 2023",
                                 "author": "Liis Tamm, Ott Kask"}
    finally:
        svc.close()

    (docs / "cranes.md").write_text(
        ARTICLE.replace("Nordwind Gazette", "Baltic Ledger").replace(
            "{body}", _paragraphs(24, "cranes")
        ),
        encoding="utf-8",
    )
    update = build_index(ws)
    assert update.stats["units_extracted"] == 0 and update.stats["reports_generated"] == 0
    assert update.stats["embedded"] >= len(units)
    svc = CanopyService(ws)
    try:
        with svc.context(None) as ctx:
            def search(text: str) -> set[str]:
                hits = asyncio.run(ctx.reader.search("text_units", vector=None, text=text, k=20))
                return {h.id for h in hits}

            found, gone = search("Baltic Ledger"), search("Nordwind")
        assert {u.id for u in units} <= found and not gone & {u.id for u in units}
    finally:
        svc.close()
    assert build_index(ws).stats["noop"]


# A one-page PDF with one line of text (Helvetica), written by hand: offsets in the xref table
# are computed below so that pypdf reads it without repairs.
def _pdf_bytes(line: str) -> bytes:
    stream = f"BT /F1 12 Tf 72 720 Td ({line}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
         b"/Resources << /Font << /F1 5 0 R >> >> >>"),
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def test_pdf_text_is_loaded_and_a_broken_pdf_is_a_visible_skip(tmp_path: Path) -> None:
    pytest.importorskip("pypdf")
    (tmp_path / "memo.pdf").write_bytes(_pdf_bytes("Maria Okafor approved Project Kestrel."))
    assert "Maria Okafor approved Project Kestrel." in load_file(tmp_path / "memo.pdf")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf body")
    scanned = {d.path: d for d in scan_folder(tmp_path, InputSettings())}
    assert scanned["memo.pdf"].title == "Maria Okafor approved Project Kestrel."
    assert scanned["broken.pdf"].reason.startswith(("could not be read", "no text content"))

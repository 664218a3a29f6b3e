"""Resource limits of every loader (issue 9, case 6: a 1 MB .docx that inflated to ~300 MB of XML
ran for 206 s and died with MemoryError; `max_file_bytes` checked only the compressed size).

The bombs are built small in tmp_path and the limits lowered through `InputSettings`; each file
over a limit becomes a recorded skip naming the limit, and the files after it still load.
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import pytest

from canopy.indexer.loaders import LoadedDocument, scan_folder
from canopy.model import Skip
from canopy.settings import InputSettings

docx = pytest.importorskip("docx")
pypdf = pytest.importorskip("pypdf")


def scan(root: Path, **limits: object) -> tuple[dict[str, LoadedDocument], dict[str, Skip]]:
    docs: dict[str, LoadedDocument] = {}
    skips: dict[str, Skip] = {}
    for item in scan_folder(root, InputSettings(**limits)):
        (skips if isinstance(item, Skip) else docs)[item.path] = item  # type: ignore[index]
    return docs, skips


def write_docx(path: Path, paragraphs: list[str]) -> None:
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    document.save(str(path))


def docx_bomb(path: Path, unpacked_bytes: int) -> None:
    """A valid DOCX whose document.xml inflates to about `unpacked_bytes` of repetitive XML."""
    write_docx(path, ["Maria Okafor leads Project Kestrel."])
    with zipfile.ZipFile(path) as src:
        members = {i.filename: src.read(i) for i in src.infolist()}
    body = b"<w:p><w:r><w:t>bomb</w:t></w:r></w:p>" * (unpacked_bytes // 36)
    xml = members["word/document.xml"]
    members["word/document.xml"] = xml.replace(b"<w:body>", b"<w:body>" + body, 1)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for name, data in members.items():
            dst.writestr(name, data)


def slow_pdf(path: Path, text_ops: int) -> None:
    """A one-page PDF of a few KB whose text extraction takes seconds (pure Python in pypdf)."""
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = pypdf.PdfWriter()
    page = writer.add_blank_page(612, 792)
    font = DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                             NameObject("/Subtype"): NameObject("/Type1"),
                             NameObject("/BaseFont"): NameObject("/Helvetica")})
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})})
    stream = DecodedStreamObject()
    stream.set_data(b"BT /F1 12 Tf 72 720 Td " + b"(word) Tj 1 0 Td " * text_ops + b"ET")
    page[NameObject("/Contents")] = writer._add_object(stream)
    with path.open("wb") as fh:
        writer.write(fh)


def blank_pdf(path: Path, pages: int) -> None:
    writer = pypdf.PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(612, 792)
    with path.open("wb") as fh:
        writer.write(fh)


def test_a_docx_that_inflates_past_max_unpacked_bytes_is_skipped_fast(tmp_path: Path) -> None:
    docx_bomb(tmp_path / "bomb.docx", 8_000_000)
    write_docx(tmp_path / "ok.docx", ["Maria Okafor leads Project Kestrel."])
    assert (tmp_path / "bomb.docx").stat().st_size < 100_000  # small on disk: max_file_bytes passes
    t0 = time.monotonic()
    docs, skips = scan(tmp_path, max_unpacked_bytes=2_000_000)
    assert time.monotonic() - t0 < 30
    assert "max_unpacked_bytes" in skips["bomb.docx"].reason
    assert docs["ok.docx"].text == "Maria Okafor leads Project Kestrel."


def test_paragraph_page_and_text_limits_skip_the_file_and_name_the_limit(tmp_path: Path) -> None:
    write_docx(tmp_path / "long.docx", [f"Paragraph {n}." for n in range(50)])
    blank_pdf(tmp_path / "pages.pdf", 6)
    (tmp_path / "rows.csv").write_text("name,role\n" + "".join(f"p{n},r{n}\n" for n in range(50)))
    (tmp_path / "rows.jsonl").write_text("".join(f'{{"n": {n}}}\n' for n in range(50)))
    (tmp_path / "big.txt").write_text("word " * 400)
    (tmp_path / "small.txt").write_text("A short note about Project Kestrel.")
    docs, skips = scan(tmp_path, max_paragraphs=20, max_pages=5, max_text_chars=1000)
    assert "max_paragraphs" in skips["long.docx"].reason
    assert "max_pages" in skips["pages.pdf"].reason
    assert "max_paragraphs" in skips["rows.csv"].reason
    assert "max_paragraphs" in skips["rows.jsonl"].reason
    assert "max_text_chars" in skips["big.txt"].reason
    assert set(docs) == {"small.txt"}


def test_a_pdf_that_takes_longer_than_load_timeout_s_is_skipped_and_the_next_still_loads(
        tmp_path: Path) -> None:
    slow_pdf(tmp_path / "a-slow.pdf", 60_000)  # several seconds of extraction
    slow_pdf(tmp_path / "b-fine.pdf", 10)
    t0 = time.monotonic()
    docs, skips = scan(tmp_path, load_timeout_s=0.5)
    assert "load_timeout_s" in skips["a-slow.pdf"].reason
    assert "word" in docs["b-fine.pdf"].text
    assert time.monotonic() - t0 < 20


def test_defaults_are_what_a_user_would_expect() -> None:
    limits = InputSettings()
    assert limits.max_unpacked_bytes >= 5 * limits.max_file_bytes  # text XML compresses ~5-20x
    assert limits.max_pages >= 1000 and limits.max_paragraphs >= 100_000
    assert limits.max_text_chars >= limits.max_file_bytes  # a text file at max_file_bytes loads
    assert 60 <= limits.load_timeout_s <= 600

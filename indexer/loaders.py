"""Load documents from a folder: text, markdown, HTML, CSV/JSONL rows, PDF and DOCX.

Two steps: `list_files` (in `canopy.indexer.listing`: which files are documents, under which path;
links are never followed) and `load_entry` (one file's text); `scan_folder` is the two together.

Encoding policy: UTF-8 (a BOM is honoured, as is a UTF-16 BOM); otherwise Windows-1252 when it
decodes cleanly and the detector is not confident in another code page; otherwise
charset-normalizer's guess if it is confident; otherwise the file is skipped as undecodable.
Binary files, links, files over `max_file_bytes` or over a loader limit (`max_unpacked_bytes`,
`max_pages`, `max_paragraphs`, `max_text_chars`, `load_timeout_s`), the index folder and
`canopy.toml` are never indexed; every skip has a reason that `canopy status` shows.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from canopy.indexer.listing import FileEntry, FileRefused, file_suffix, list_files, read_beneath
from canopy.indexer.office import LimitExceeded, Limits, MissingDependency
from canopy.indexer.parse_worker import ParseFailed, parse_office
from canopy.model import Skip
from canopy.settings import InputSettings

__all__ = ["FileEntry", "LoadedDocument", "front_matter", "list_files", "load_entry", "load_file",
           "metadata_pairs", "scan_folder"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedDocument:
    path: str  # relative POSIX display path (`canopy.indexer.listing.display_name`)
    title: str
    text: str  # for Markdown with front matter: the body after it
    metadata: tuple[tuple[str, str], ...] = ()  # rendered front-matter fields (metadata_pairs)


class _SkipFile(Exception):
    pass


def scan_folder(root: Path, settings: InputSettings, index_dir: Path | None = None
                ) -> Iterator[LoadedDocument | Skip]:
    """Every indexable file under root, in path order; unreadable ones as `Skip` records."""
    for entry in list_files(root, settings, index_dir):
        yield entry if isinstance(entry, Skip) else load_entry(entry, settings)


def load_entry(entry: FileEntry, settings: InputSettings) -> LoadedDocument | Skip:
    """One listed file as a document, or a `Skip` saying why not (one bad file never stops the
    rest). The file is opened beneath the folder without following links (`read_beneath`)."""
    rel = entry.path
    suffix = file_suffix(rel)
    try:
        text = extract_text(read_beneath(entry, settings.max_file_bytes), suffix, settings)
        fields: dict[str, Any] = {}
        if settings.front_matter and suffix in _MARKDOWN:
            fields, text = front_matter(text, rel)
        if not text.strip():
            raise _SkipFile("no text content")
        title = fields.get("title")
        title = " ".join(str(title).split())[:120] if _scalar(title) and str(title).strip() else ""
        return LoadedDocument(rel, title or _title(PurePosixPath(rel).stem, text), text,
                              metadata_pairs(fields, settings.metadata_fields))
    except (_SkipFile, FileRefused, LimitExceeded, MissingDependency, ParseFailed) as exc:
        return Skip(rel, str(exc))  # reasons written by Canopy, never a parser's text
    except FileNotFoundError:
        return Skip(rel, "vanished while being read")
    except Exception as exc:  # one bad file never stops the rest
        log.warning("skipping %s: %s", rel, type(exc).__name__)
        return Skip(rel, f"could not be read: {type(exc).__name__}")


def load_file(path: Path, settings: InputSettings | None = None) -> str:
    """The text of one file by its extension (no listing rules, no front matter split)."""
    settings = settings or InputSettings()
    return extract_text(path.read_bytes(), path.suffix.lower(), settings)


def extract_text(raw: bytes, suffix: str, settings: InputSettings) -> str:
    """Text of a file's bytes by extension, within the loader limits of `settings`."""
    limits = Limits(settings.max_unpacked_bytes, settings.max_pages, settings.max_paragraphs,
                    settings.max_text_chars)
    if suffix in (".pdf", ".docx"):
        text = parse_office(suffix[1:], raw, limits, settings.load_timeout_s)
    else:
        text = decode_bytes(raw)
        if suffix in (".html", ".htm"):
            text = _html(text)
        elif suffix == ".csv":
            text = _csv(text, settings.max_paragraphs)
        elif suffix == ".jsonl":
            text = _jsonl(text, settings.max_paragraphs)
    if len(text) > settings.max_text_chars:
        raise _SkipFile(f"extracted text longer than max_text_chars (> {settings.max_text_chars})")
    return text


_MARKDOWN = frozenset({".md", ".markdown"})
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?\n)?(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)
MAX_VALUE_CHARS = 200  # a longer value is cut: the header repeats in every unit's context block
MAX_FIELDS = 12
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ][0-9:.]+(Z|[+-]\d{2}:?\d{2})?)?$")
_LINK = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|mailto:|www\.)", re.IGNORECASE)


def front_matter(text: str, rel: str = "") -> tuple[dict[str, Any], str]:
    """(fields, body) of a Markdown text that opens with a YAML front-matter block; ({}, text)
    when it has none, or when the block is not a YAML mapping (then it stays part of the text)."""
    m = _FRONT_MATTER.match(text)
    if not m:
        return {}, text
    try:
        fields = yaml.safe_load(m.group(1) or "")
    except yaml.YAMLError as exc:
        log.warning("%s: front matter is not valid YAML, kept as text (%s)", rel,
                    str(exc).splitlines()[0])
        return {}, text
    if fields is None:
        fields = {}
    if not isinstance(fields, dict):
        return {}, text
    return {str(k): v for k, v in fields.items()}, text[m.end():]


def metadata_pairs(fields: dict[str, Any],
                   keep: list[str] | None = None) -> tuple[tuple[str, str], ...]:
    """Front-matter fields as (field, value) text pairs: scalars, dates written out ("October 6,
    2023", as people ask for them) and lists of scalars; not the title (the document's name),
    flags, nested mappings or links (their words would match every question about the web)."""
    wanted = {k.lower() for k in keep or []}
    out: list[tuple[str, str]] = []
    for key, value in fields.items():
        name = " ".join(key.split())
        if not name or name.lower() == "title" or (wanted and name.lower() not in wanted):
            continue
        items = value if isinstance(value, list) else [value]
        rendered = [r for r in (_render(v) for v in items) if r]
        if rendered:
            text = ", ".join(rendered)
            if len(text) > MAX_VALUE_CHARS:
                text = text[:MAX_VALUE_CHARS].rstrip() + "…"
            out.append((name, text))
    return tuple(out[:MAX_FIELDS])


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, dt.date)) and not isinstance(value, bool)


def _render(value: Any) -> str:
    if not _scalar(value):
        return ""
    if isinstance(value, str) and _ISO_DATE.match(value.strip()):  # a quoted date
        try:
            value = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            pass
    if isinstance(value, dt.date):  # datetime is a date too; the time of day is dropped
        return f"{value:%B} {value.day}, {value.year}"
    text = " ".join(str(value).split())
    return "" if _LINK.match(text) else text


def _title(stem: str, text: str) -> str:
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line[:120]
    return stem


def decode_bytes(raw: bytes) -> str:
    """Text of a file's bytes, newlines normalised to \n; raises _SkipFile when undecodable."""
    return _decode(raw).replace("\r\n", "\n").replace("\r", "\n")


_SINGLE_BYTE_LATIN = ("cp125", "cp437", "cp775", "cp85", "cp86", "iso8859", "latin", "mac_")


def _decode(raw: bytes) -> str:
    if raw.startswith(b"\xef\xbb\xbf"):
        return raw[3:].decode("utf-8")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return raw.decode("utf-16")
    if b"\0" in raw[:8192]:
        raise _SkipFile("binary file (NUL bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    # Short files make detectors guess exotic code pages; Windows-1252 (a superset of Latin-1
    # for printable text) is by far the most common legacy encoding, so it wins whenever it
    # decodes cleanly and the detector is not clearly more confident in something else.
    results = list(from_bytes(raw))
    if not results or results[0].chaos > 0.2:
        raise _SkipFile("undecodable: not UTF-8 and no confident encoding guess")
    try:
        western: str | None = raw.decode("cp1252")
    except UnicodeDecodeError:
        western = None
    # Among single-byte Latin code pages the detector's pick is a coin toss on short texts; a
    # multi-byte guess (GBK, Shift-JIS, EUC-KR...) is trusted as is.
    if western is not None and results[0].encoding.startswith(_SINGLE_BYTE_LATIN):
        return western
    return str(results[0])


def _html(text: str) -> str:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(text, "html.parser")
    for tag in soup(["script", "style", "noscript"]):
        tag.decompose()
    blocks = [el.get_text(" ", strip=True)
              for el in soup.find_all(["h1", "h2", "h3", "h4", "p", "li", "td", "pre"])]
    body = "\n\n".join(b for b in blocks if b)
    return body or soup.get_text("\n", strip=True)


def _too_many_rows(max_rows: int) -> _SkipFile:
    return _SkipFile(f"more rows than max_paragraphs (> {max_rows})")


def _csv(text: str, max_rows: int) -> str:
    """One paragraph per row: `column: value` pairs, so rows chunk and cite individually."""
    reader = csv.DictReader(io.StringIO(text))
    rows: list[str] = []
    for row in reader:
        if len(rows) >= max_rows:
            raise _too_many_rows(max_rows)
        rows.append("; ".join(f"{k}: {v}" for k, v in row.items() if k and v))
    return "\n\n".join(rows)


def _jsonl(text: str, max_rows: int) -> str:
    rows: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(rows) >= max_rows:
            raise _too_many_rows(max_rows)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            log.warning("jsonl line %d is not JSON; kept as text", n)
            rows.append(line)
            continue
        if isinstance(obj, dict):
            rows.append("\n".join(f"{k}: {v}" for k, v in obj.items()
                                   if isinstance(v, (str, int, float))))
        else:
            rows.append(str(obj))
    return "\n\n".join(rows)

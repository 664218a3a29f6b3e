"""Text of PDF and DOCX bytes within resource limits (run inside `canopy.indexer.parse_worker`).

Compressed formats are where a small file becomes a large one: a 1 MB DOCX can hold 300 MB of
XML, a PDF thousands of pages. Each limit is checked before the expensive step it guards: the
unpacked size of a DOCX before python-docx parses anything, a PDF's page count before any page's
text; extracted text is counted as it grows. A file over a limit raises `LimitExceeded`, whose
message is its skip reason.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass

from canopy.extras import install_hint

__all__ = ["LimitExceeded", "Limits", "docx_text", "pdf_text"]


@dataclass(frozen=True)
class Limits:
    max_unpacked_bytes: int
    max_pages: int
    max_paragraphs: int
    max_text_chars: int


class LimitExceeded(Exception):
    """The file is over one of the `Limits`; the message says which, for `canopy status`."""


class MissingDependency(Exception):
    """A loader's library (a dependency of Canopy) is missing from this environment."""


def pdf_text(data: bytes, limits: Limits) -> str:
    try:
        from pypdf import PdfReader
    except ImportError as exc:
        raise MissingDependency(f"PDF support needs pypdf: {install_hint('pypdf')}") from exc
    reader = PdfReader(io.BytesIO(data))
    pages = len(reader.pages)
    if pages > limits.max_pages:
        raise LimitExceeded(f"more pages than max_pages ({pages} > {limits.max_pages})")
    parts: list[str] = []
    total = 0
    for page in reader.pages:
        text = page.extract_text() or ""
        total += len(text) + 2
        if total > limits.max_text_chars:
            raise _too_long(limits.max_text_chars)
        parts.append(text)
    return "\n\n".join(parts)


def docx_text(data: bytes, limits: Limits) -> str:
    try:
        import docx
    except ImportError as exc:
        raise MissingDependency(
            f"DOCX support needs python-docx: {install_hint('python-docx')}") from exc
    check_unpacked_size(data, limits.max_unpacked_bytes)
    paragraphs = docx.Document(io.BytesIO(data)).paragraphs
    if len(paragraphs) > limits.max_paragraphs:
        raise LimitExceeded(
            f"more paragraphs than max_paragraphs ({len(paragraphs)} > {limits.max_paragraphs})")
    text = "\n\n".join(p.text for p in paragraphs if p.text.strip())
    if len(text) > limits.max_text_chars:
        raise _too_long(limits.max_text_chars)
    return text


def _too_long(limit: int) -> LimitExceeded:
    return LimitExceeded(f"extracted text longer than max_text_chars (> {limit})")


def check_unpacked_size(data: bytes, max_bytes: int) -> None:
    """Raise `LimitExceeded` when the zip's members inflate to more than max_bytes in all.

    The declared sizes suffice: zipfile (which python-docx reads through) never inflates a
    member past its declared size, and a member whose data runs longer fails its CRC check."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        total = sum(m.file_size for m in archive.infolist())
    if total > max_bytes:
        raise LimitExceeded(f"unpacks to more than max_unpacked_bytes ({total} > {max_bytes})")

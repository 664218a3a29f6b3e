"""A Microsoft GraphRAG output folder, read and checked (`read_output`).

GraphRAG (3.x) writes its index as parquet tables: documents, text_units, entities,
relationships, communities and community_reports, and covariates (its claims) when its claim
extraction is enabled. Only the columns the import maps are read (pyarrow, already a Canopy
dependency); a missing table or column is a `NotGraphRAGOutput` with one line naming it, before
anything is written. covariates.parquet is optional: without it there are no claims to import.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canopy.errors import CanopyError

__all__ = ["GRClaim", "GRDocument", "GREntity", "GRCommunity", "GRFinding", "GROutput",
           "GRRelationship", "GRReport", "GRUnit", "NotGraphRAGOutput", "cited", "read_output"]

# table -> the columns the import reads
REQUIRED: dict[str, tuple[str, ...]] = {
    "documents": ("id", "title", "text"),
    "text_units": ("id", "text", "document_id"),
    "entities": ("id", "human_readable_id", "title", "type", "description", "text_unit_ids"),
    "relationships": ("human_readable_id", "source", "target", "description", "weight",
                      "text_unit_ids"),
    "communities": ("community", "level", "parent", "entity_ids"),
    "community_reports": ("community", "title", "summary", "rank", "rating_explanation",
                          "findings"),
}
# optional tables -> the columns the import reads when the table is there
OPTIONAL: dict[str, tuple[str, ...]] = {
    "covariates": ("subject_id", "object_id", "type", "status", "start_date", "end_date",
                   "description", "source_text", "text_unit_id"),
}


class NotGraphRAGOutput(CanopyError):
    """The folder is not a readable GraphRAG output folder (what is wrong, in one line)."""


@dataclass(frozen=True)
class GRDocument:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class GRUnit:
    id: str
    document_id: str
    text: str


@dataclass(frozen=True)
class GREntity:
    id: str
    human_id: int
    title: str
    type: str
    description: str
    unit_ids: tuple[str, ...]


@dataclass(frozen=True)
class GRRelationship:
    human_id: int
    source: str  # entity title
    target: str
    description: str
    weight: float
    unit_ids: tuple[str, ...]


@dataclass(frozen=True)
class GRCommunity:
    community: int
    level: int
    parent: int | None
    entity_ids: tuple[str, ...]


@dataclass(frozen=True)
class GRFinding:
    summary: str
    explanation: str


@dataclass(frozen=True)
class GRReport:
    community: int
    title: str
    summary: str
    rating: float
    rating_explanation: str
    findings: tuple[GRFinding, ...]


@dataclass(frozen=True)
class GRClaim:
    """A row of covariates.parquet as GraphRAG's claim extractor wrote it: subject and object
    are names (upper case, as its prompt asks; object "NONE" when unknown), dates are whatever
    the model wrote (the prompt asks for "2022-01-10T00:00:00" or "NONE"), source_text is the
    model's quote, not checked by GraphRAG."""

    subject: str
    object: str
    type: str
    status: str
    start_date: str
    end_date: str
    description: str
    source_text: str
    unit_id: str


@dataclass
class GROutput:
    documents: list[GRDocument]
    units: list[GRUnit]
    entities: list[GREntity]
    relationships: list[GRRelationship]
    communities: list[GRCommunity]
    reports: dict[int, GRReport]  # by community number
    claims: list[GRClaim] = field(default_factory=list)  # [] without covariates.parquet


def _rows(folder: Path, table: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    path = folder / f"{table}.parquet"
    columns = REQUIRED.get(table) or OPTIONAL[table]
    if not path.is_file():
        raise NotGraphRAGOutput(f"{folder} is not a GraphRAG output folder: {table}.parquet is "
                                "missing (expected " + ", ".join(f"{t}.parquet" for t in REQUIRED)
                                + ")")
    try:
        schema = pq.read_schema(path)
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise NotGraphRAGOutput(f"{path} lacks the column(s) {', '.join(missing)} of "
                                    "GraphRAG's output (GraphRAG 2.x-3.x tables are read)")
        rows: list[dict[str, Any]] = pq.read_table(path, columns=list(columns)).to_pylist()
    except NotGraphRAGOutput:
        raise
    except Exception as exc:  # pyarrow raises several types for a damaged or foreign file
        raise NotGraphRAGOutput(f"{path} cannot be read as parquet: {exc}") from None
    return rows


def _findings(value: Any) -> tuple[GRFinding, ...]:
    if isinstance(value, str):  # some writers keep findings as JSON text
        try:
            value = json.loads(value)
        except ValueError:
            return ()
    out = []
    for f in value or ():
        if isinstance(f, dict):
            out.append(GRFinding(str(f.get("summary") or ""), str(f.get("explanation") or "")))
    return tuple(out)


def _int(value: Any) -> int:
    return int(value) if value is not None else -1


def read_output(folder: Path) -> GROutput:
    """The tables of a GraphRAG output folder (its `output/`, or the project root above it)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotGraphRAGOutput(f"{folder} is not a folder")
    if not (folder / "entities.parquet").exists() and (folder / "output").is_dir():
        folder = folder / "output"  # the GraphRAG project root was given
    docs = [GRDocument(str(r["id"]), str(r["title"] or ""), str(r["text"] or ""))
            for r in _rows(folder, "documents")]
    units = [GRUnit(str(r["id"]), str(r["document_id"]), str(r["text"] or ""))
             for r in _rows(folder, "text_units")]
    entities = [GREntity(str(r["id"]), _int(r["human_readable_id"]), str(r["title"] or ""),
                         str(r["type"] or ""), str(r["description"] or ""),
                         tuple(str(u) for u in r["text_unit_ids"] or ()))
                for r in _rows(folder, "entities")]
    rels = [GRRelationship(_int(r["human_readable_id"]), str(r["source"] or ""),
                           str(r["target"] or ""), str(r["description"] or ""),
                           float(r["weight"] or 1.0),
                           tuple(str(u) for u in r["text_unit_ids"] or ()))
            for r in _rows(folder, "relationships")]
    communities = [GRCommunity(_int(r["community"]), _int(r["level"]),
                               None if r["parent"] is None or int(r["parent"]) < 0
                               else int(r["parent"]),
                               tuple(str(e) for e in r["entity_ids"] or ()))
                   for r in _rows(folder, "communities")]
    reports = {_int(r["community"]): GRReport(
        _int(r["community"]), str(r["title"] or ""), str(r["summary"] or ""),
        float(r["rank"] or 0.0), str(r["rating_explanation"] or ""), _findings(r["findings"]))
        for r in _rows(folder, "community_reports")}
    claims = [GRClaim(*(_text(r[c]) for c in OPTIONAL["covariates"]))
              for r in (_rows(folder, "covariates")
                        if (folder / "covariates.parquet").exists() else [])]
    if not docs:
        raise NotGraphRAGOutput(f"{folder}/documents.parquet holds no documents")
    return GROutput(docs, units, entities, rels, communities, reports, claims)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


_REFS = re.compile(r"\b(Entities|Relationships)\s*\(([^)]*)\)")


def cited(explanation: str) -> tuple[list[int], list[int]]:
    """Entity and relationship human-readable ids a GraphRAG finding cites
    (`[Data: Entities (5, 7); Relationships (23, +more)]`)."""
    ents: list[int] = []
    rels: list[int] = []
    for kind, ids in _REFS.findall(explanation):
        nums = [int(x) for x in re.findall(r"\d+", ids)]
        (ents if kind == "Entities" else rels).extend(nums)
    return ents, rels

"""A Microsoft GraphRAG output folder, read and checked (`read_output`).

GraphRAG (3.x) writes its index as parquet tables: documents, text_units, entities,
relationships, communities and community_reports, and covariates (its claims) when its claim
extraction is enabled. Only the columns the import maps are read (pyarrow, already a Canopy
dependency); a missing table or column is a `NotGraphRAGOutput` with one line naming it, before
anything is written. covariates.parquet is optional: without it there are no claims to import.
"""

from __future__ import annotations

import json
import math
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


# Bounds on what one GraphRAG field may hold: GraphRAG writes names of a few words and
# descriptions, summaries and findings of a few hundred words, so a field past these is not its
# output (and would cost the import minutes of tokenizing and embedding); documents and text
# units are the documents themselves, bounded by nothing here.
MAX_NAME_CHARS = 2_000
MAX_TEXT_CHARS = 200_000
MAX_FINDINGS = 1_000
MAX_LEVEL = 64


class _Row:
    """One row of a table, whose values are converted with checks: a value of another type
    than GraphRAG writes (or past the bounds above) is a NotGraphRAGOutput naming the file,
    the row and the column."""

    def __init__(self, path: Path, i: int, row: dict[str, Any]) -> None:
        self.path, self.i, self.row = path, i, row

    def bad(self, column: str, problem: str) -> NotGraphRAGOutput:
        shown = repr(self.row[column])
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        return NotGraphRAGOutput(f"{self.path} row {self.i}: {column} {shown} {problem} "
                                 "(not GraphRAG's output as it writes it)")

    def text(self, column: str, limit: int | None = MAX_TEXT_CHARS) -> str:
        value = self.row[column]
        if value is None:
            return ""
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        elif isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.bad(column, "is not text")
        value = str(value)
        if limit is not None and len(value) > limit:
            raise NotGraphRAGOutput(f"{self.path} row {self.i}: {column} holds {len(value):,} "
                                    f"characters, more than the {limit:,} an import takes")
        return value

    def integer(self, column: str) -> int:
        value = self.row[column]
        if value is None:
            return -1
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(column, "is not an integer")
        return value

    def number(self, column: str, default: float) -> float:
        value = self.row[column]
        if value is None:
            return default
        try:
            got = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            got = math.nan
        if not math.isfinite(got):
            raise self.bad(column, "is not a finite number")
        return got

    def weight(self, column: str) -> float:
        """A relationship's weight: positive (0 or none count as 1, as GraphRAG's default)."""
        got = self.number(column, 1.0)
        if got < 0:
            raise self.bad(column, "is negative")
        return got or 1.0

    def ids(self, column: str) -> tuple[str, ...]:
        value = self.row[column]
        if value is None:
            return ()
        if isinstance(value, str | bytes | dict) or not hasattr(value, "__iter__"):
            raise self.bad(column, "is not a list of ids")
        out = []
        for v in value:
            if not isinstance(v, str | int) or isinstance(v, bool):
                raise self.bad(column, "holds an id that is not text")
            out.append(str(v))
        return tuple(out)

    def findings(self, column: str) -> tuple[GRFinding, ...]:
        value = self.row[column]
        if isinstance(value, str):  # some writers keep findings as JSON text
            try:
                value = json.loads(value)
            except RecursionError:
                raise self.bad(column, "is JSON nested too deeply") from None
            except ValueError:
                return ()
        if value is None:
            return ()
        if isinstance(value, dict) or not hasattr(value, "__iter__"):
            raise self.bad(column, "is not a list of findings")
        value = list(value)
        if len(value) > MAX_FINDINGS:
            raise NotGraphRAGOutput(f"{self.path} row {self.i}: {column} holds {len(value):,} "
                                    f"findings, more than the {MAX_FINDINGS:,} an import takes")
        out = []
        for f in value:
            if isinstance(f, dict):
                summary, explanation = f.get("summary"), f.get("explanation")
                if not isinstance(summary, str | None) or not isinstance(explanation, str | None):
                    raise self.bad(column, "holds a finding that is not text")
                if len(summary or "") + len(explanation or "") > MAX_TEXT_CHARS:
                    raise NotGraphRAGOutput(f"{self.path} row {self.i}: a finding of {column} "
                                            f"holds more than {MAX_TEXT_CHARS:,} characters")
                out.append(GRFinding(summary or "", explanation or ""))
        return tuple(out)


def _table(folder: Path, table: str) -> list[_Row]:
    path = folder / f"{table}.parquet"
    return [_Row(path, i, r) for i, r in enumerate(_rows(folder, table))]


def _check_hierarchy(folder: Path, communities: list[GRCommunity]) -> None:
    """One row per community, levels GraphRAG could write, and every parent on a shallower
    level than its child (so no parent chain can loop: a loop made the import append to the
    same chain until memory ran out)."""
    path = folder / "communities.parquet"
    level: dict[int, int] = {}
    for c in communities:
        if c.community in level:
            raise NotGraphRAGOutput(f"{path}: community {c.community} appears twice")
        if not 0 <= c.level <= MAX_LEVEL:
            raise NotGraphRAGOutput(f"{path}: community {c.community} has level {c.level} "
                                    f"(GraphRAG's levels run from 0, here at most {MAX_LEVEL})")
        level[c.community] = c.level
    for c in communities:
        if c.parent is not None and c.parent in level and level[c.parent] >= c.level:
            raise NotGraphRAGOutput(f"{path}: community {c.community} (level {c.level}) has "
                                    f"parent {c.parent} at level {level[c.parent]}: a parent is "
                                    "one level up")


def read_output(folder: Path) -> GROutput:
    """The tables of a GraphRAG output folder (its `output/`, or the project root above it)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotGraphRAGOutput(f"{folder} is not a folder")
    if not (folder / "entities.parquet").exists() and (folder / "output").is_dir():
        folder = folder / "output"  # the GraphRAG project root was given
    docs = [GRDocument(r.text("id", MAX_NAME_CHARS), r.text("title", MAX_NAME_CHARS),
                       r.text("text", None)) for r in _table(folder, "documents")]
    units = [GRUnit(r.text("id", MAX_NAME_CHARS), r.text("document_id", MAX_NAME_CHARS),
                    r.text("text", None)) for r in _table(folder, "text_units")]
    entities = [GREntity(r.text("id", MAX_NAME_CHARS), r.integer("human_readable_id"),
                         r.text("title", MAX_NAME_CHARS), r.text("type", MAX_NAME_CHARS),
                         r.text("description"), r.ids("text_unit_ids"))
                for r in _table(folder, "entities")]
    rels = [GRRelationship(r.integer("human_readable_id"), r.text("source", MAX_NAME_CHARS),
                           r.text("target", MAX_NAME_CHARS), r.text("description"),
                           r.weight("weight"), r.ids("text_unit_ids"))
            for r in _table(folder, "relationships")]
    communities = []
    for r in _table(folder, "communities"):
        parent = r.integer("parent")
        communities.append(GRCommunity(r.integer("community"), r.integer("level"),
                                       None if parent < 0 else parent, r.ids("entity_ids")))
    _check_hierarchy(folder, communities)
    reports = {}
    for r in _table(folder, "community_reports"):
        community = r.integer("community")
        reports[community] = GRReport(community, r.text("title", MAX_NAME_CHARS),
                                      r.text("summary"), r.number("rank", 0.0),
                                      r.text("rating_explanation"), r.findings("findings"))
    claims = [GRClaim(*(r.text(c) for c in OPTIONAL["covariates"]))
              for r in (_table(folder, "covariates")
                        if (folder / "covariates.parquet").exists() else [])]
    if not docs:
        raise NotGraphRAGOutput(f"{folder}/documents.parquet holds no documents")
    return GROutput(docs, units, entities, rels, communities, reports, claims)


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

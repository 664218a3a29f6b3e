"""The rows of an export, as one caller is served them (`collect_tables`).

Everything is read through the caller's reader (canopy.acl.reader), as the query engines read: each
artifact is the canonical one when the caller may read all of its sources, else their view of
it (canopy.acl.views), else absent. Counts and numbers are computed over the exported rows only, so
none reveals what the caller cannot read: `degree` counts exported relationships, `frequency`
and `size` count exported units and members, and `human_readable_id` / `community` number the
exported rows.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from canopy.model import Document, Entity, Relationship, Report, TextUnit
from canopy.server.context import QueryContext
from canopy.server.engines.cards import finding_cards

__all__ = ["ExportTables", "collect_tables"]

Row = dict[str, Any]
DocumentsOf = Callable[[Iterable[str]], list[str]]  # unit ids -> their documents' ids
_BATCH = 500  # artifacts per reader call (views of a batch are built concurrently)


@dataclass
class ExportTables:
    """Rows per table (canopy.server.wings.graphrag.export.columns.TABLES names their columns)."""

    rows: dict[str, list[Row]] = field(default_factory=dict)

    def count(self, table: str) -> int:
        return len(self.rows.get(table, []))


def _batches(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), _BATCH):
        yield ids[start:start + _BATCH]


def _sorted(ids: Iterable[str]) -> list[str]:
    return sorted(set(ids))


async def collect_tables(ctx: QueryContext) -> ExportTables:
    """Every document, text unit, entity, relationship, claim, community and report the caller
    is served, as table rows. Holds the caller's whole graph in memory (an export, not a
    query); a restricted caller's views are built as needed, as `canopy warm` builds them."""
    reader, inventory = ctx.reader, ctx.reader.inventory
    documents = sorted(reader.documents(), key=lambda d: d.path)
    unit_ids = inventory.unit_ids_of(d.id for d in documents)
    units = reader.units(u for d in documents for u in unit_ids.get(d.id, []))
    doc_of = {u: unit.document_id for u, (unit, _) in units.items()}

    entities: dict[str, Entity] = {}
    for batch in _batches(inventory.readable_ids("entities")):
        entities.update(await reader.entities(batch))
    relationships: dict[str, Relationship] = {}
    for batch in _batches(inventory.readable_ids("relationships")):
        got = await reader.relationships(batch)
        relationships.update({i: r for i, r in got.items()
                              if r.source in entities and r.target in entities})
    claims = [c for batch in _batches(sorted(entities)) for c in reader.claims_of(batch)]
    claims = list({c.id: c for c in claims if c.subject in entities
                   and (not c.object or c.object in entities)}.values())

    def docs(unit_ids: Iterable[str]) -> list[str]:
        return _sorted(doc_of[u] for u in unit_ids if u in doc_of)

    degree: dict[str, int] = defaultdict(int)
    for r in relationships.values():
        degree[r.source] += 1
        degree[r.target] += 1
    out = ExportTables()
    out.rows["entities"] = [_entity_row(n, e, degree[e.id], docs(e.text_unit_ids))
                            for n, e in enumerate(sorted(entities.values(), key=lambda e: e.id))]
    out.rows["relationships"] = [
        _relationship_row(n, r, entities, degree, docs(r.text_unit_ids))
        for n, r in enumerate(sorted(relationships.values(), key=lambda r: r.id))]
    out.rows["covariates"] = [
        {"id": c.id, "human_readable_id": n, "covariate_type": "claim", "type": c.type,
         "description": c.description, "subject_id": entities[c.subject].name,
         "object_id": entities[c.object].name if c.object else "", "status": c.status,
         "start_date": c.start_date, "end_date": c.end_date, "source_text": c.quote,
         "text_unit_id": c.text_unit_ids[0] if c.text_unit_ids else "",
         "subject_entity_id": c.subject, "object_entity_id": c.object,
         "document_ids": docs(c.text_unit_ids)}
        for n, c in enumerate(sorted(claims, key=lambda c: c.id))]
    await _communities(ctx, out, entities, relationships, docs)
    out.rows["text_units"] = _unit_rows(documents, unit_ids, units, out)
    out.rows["documents"] = [_document_row(n, d, [units[u] for u in unit_ids.get(d.id, [])
                                                  if u in units])
                             for n, d in enumerate(documents)]
    return out


def _entity_row(n: int, e: Entity, degree: int, documents: list[str]) -> Row:
    return {"id": e.id, "human_readable_id": n, "title": e.name, "type": e.type,
            "description": e.description, "text_unit_ids": list(e.text_unit_ids),
            "frequency": len(e.text_unit_ids), "degree": degree, "document_ids": documents}


def _relationship_row(n: int, r: Relationship, entities: dict[str, Entity],
                      degree: dict[str, int], documents: list[str]) -> Row:
    return {"id": r.id, "human_readable_id": n, "source": entities[r.source].name,
            "target": entities[r.target].name, "description": r.description,
            "weight": float(r.weight), "combined_degree": degree[r.source] + degree[r.target],
            "text_unit_ids": list(r.text_unit_ids), "source_id": r.source, "target_id": r.target,
            "document_ids": documents}


async def _communities(ctx: QueryContext, out: ExportTables, entities: dict[str, Entity],
                       relationships: dict[str, Relationship], docs: DocumentsOf) -> None:
    """The communities with a member the caller is served (every level of the hierarchy a
    caller sees partitions what they see), and the reports of those they are served."""
    reader = ctx.reader
    members: dict[str, list[str]] = {}
    for cid in reader.inventory.community_ids_by_level():
        served = sorted(e for e in reader.members(cid) if e in entities)
        if served:
            members[cid] = served
    rows = reader.community_rows(members)
    order = sorted(members, key=lambda c: (rows[c].level, c))
    number = {cid: n for n, cid in enumerate(order)}
    children: dict[str, list[int]] = defaultdict(list)
    for cid in order:
        up = rows[cid].parent
        if up is not None and up in number:
            children[up].append(number[cid])
    communities = []
    for cid in order:
        inside = set(members[cid])
        rels = [r for r in _sorted(reader.inventory.relationships_among(cid))
                if r in relationships and {relationships[r].source,
                                           relationships[r].target} <= inside]
        units = _sorted([u for e in inside for u in entities[e].text_unit_ids]
                        + [u for r in rels for u in relationships[r].text_unit_ids])
        parent = rows[cid].parent
        communities.append({
            "id": cid, "human_readable_id": number[cid], "community": number[cid],
            "level": rows[cid].level, "parent": number.get(parent, -1) if parent else -1,
            "children": children[cid], "title": f"Community {number[cid]}",
            "entity_ids": members[cid], "relationship_ids": rels, "text_unit_ids": units,
            "size": len(inside), "document_ids": docs(units)})
    out.rows["communities"] = communities
    reports: dict[str, Report] = {}
    for batch in _batches(order):
        reports.update(await reader.reports(batch))
    by_id = {c["id"]: c for c in communities}
    out.rows["community_reports"] = [_report_row(ctx, reports[cid], by_id[cid], docs)
                                     for cid in order if cid in reports]


def _report_row(ctx: QueryContext, report: Report, community: Row, docs: DocumentsOf) -> Row:
    findings = [f.model_dump() for f in finding_cards(ctx.reader, report)]
    content = {"title": report.title, "summary": report.summary, "rating": report.rating,
               "rating_explanation": report.rating_explanation, "findings": findings}
    return {"id": report.community_id, "human_readable_id": community["community"],
            "community": community["community"], "level": report.level,
            "parent": community["parent"], "children": community["children"],
            "title": report.title, "summary": report.summary, "full_content": report.full_text(),
            "rank": float(report.rating), "rating_explanation": report.rating_explanation,
            "findings": findings, "full_content_json": json.dumps(content, ensure_ascii=False),
            "size": community["size"], "text_unit_ids": list(report.text_unit_ids),
            "document_ids": docs(report.text_unit_ids)}


def _unit_rows(documents: list[Document], unit_ids: dict[str, list[str]],
               units: dict[str, tuple[TextUnit, Document]], out: ExportTables) -> list[Row]:
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for table, column in (("entities", "entity_ids"), ("relationships", "relationship_ids")):
        for row in out.rows[table]:
            for u in row["text_unit_ids"]:
                found[u][column].append(row["id"])
    for row in out.rows["covariates"]:
        found[row["text_unit_id"]]["covariate_ids"].append(row["id"])
    ordered = sorted((units[u][0] for d in documents for u in unit_ids.get(d.id, [])
                      if u in units), key=lambda t: (units[t.id][1].path, t.ordinal))
    return [{"id": t.id, "human_readable_id": n, "text": t.text, "n_tokens": t.n_tokens,
             "document_ids": [t.document_id], "entity_ids": found[t.id]["entity_ids"],
             "relationship_ids": found[t.id]["relationship_ids"],
             "covariate_ids": found[t.id]["covariate_ids"], "document_id": t.document_id}
            for n, t in enumerate(ordered)]


def _document_row(n: int, doc: Document, units: list[tuple[TextUnit, Document]]) -> Row:
    ordered = sorted((u for u, _ in units), key=lambda u: u.ordinal)
    return {"id": doc.id, "human_readable_id": n, "title": doc.title,
            "text": _document_text(ordered, doc.n_chars), "text_unit_ids": [u.id for u in ordered],
            "metadata": json.dumps(dict(doc.metadata), ensure_ascii=False), "path": doc.path}


def _document_text(units: list[TextUnit], n_chars: int) -> str:
    """The document as loaded, from its units' own spans (so units' char_start/char_end index
    it). What lies between two spans (the whitespace chunking cut at) is the end of the next
    unit's overlap prefix; without a prefix long enough, or at either end, newlines stand in."""
    parts, end = [], 0
    for u in units:
        own = u.char_end - u.char_start
        body = len(u.text) - own if 0 < own <= len(u.text) else 0
        gap = u.char_start - end
        if gap > 0:
            parts.append(u.text[body - gap:body] if body >= gap else "\n" * gap)
        parts.append(u.text[body:])
        end = max(end, u.char_end)
    parts.append("\n" * (n_chars - end))
    return "".join(parts)

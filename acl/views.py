"""Per-caller views of derived artifacts (design §2, "fallback views").

When a canonical artifact is not servable to a caller (some text unit it derives from is hidden
from them, or was revoked), the caller is served a view of it instead, derived only from the live
units they can read:

- entity: name, type and description re-derived from the entity's instances in those units; one
  distinct description is used as is, several are summarized by the provider (memoized with the
  indexer's key, so a visible subset summarized once is never summarized again);
- relationship: likewise, when both endpoints exist for the caller;
- community report: written by the indexer's report writer
  (canopy.indexer.report_writer.write_report) from the visible part of the community: its
  visible members (views where partial), visible
  relationships and claims, and the visible children's reports when the context must be cut.

A view keeps the artifact's id; its provenance is exactly the units it was derived from, so it
passes the serving rule like a canonical artifact. Keys (`view_key`) hash what a view is derived
from: the artifact's content hash, the (unit, ACL class) signature of its sources, the caller's
readable classes among them, the provider and the budgets; a stale artifact also hashes each of
its live units with its class, and which of those classes the caller reads (CallerReader's
`_live_classes`). So a deletion, an edit or a relabel is never served a stale view.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from canopy.aliases import display_name
from canopy.errors import EndpointUnavailable, InvalidOutput
from canopy.ids import content_hash
from canopy.indexer.operations.merging import most_frequent, summary_input, summary_key
from canopy.indexer.operations.report_context import CommunityContent, ElementSizes
from canopy.indexer.report_writer import write_report
from canopy.model import Community, Entity, Relationship, Report
from canopy.providers.base import Provider, prompt_key
from canopy.settings import ExtractSettings, ReportSettings
from canopy.store.rows import Gate
from canopy.store.sources import cache_sources
from canopy.tokenizer import get_tokenizer

if TYPE_CHECKING:
    from canopy.acl.reader import CallerReader

__all__ = ["ViewParams", "entity_view", "relationship_view", "report_view", "view_key"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ViewParams:
    """The budgets views are written with: the indexer's settings."""

    summary_max_tokens: int = ExtractSettings().summary_max_tokens
    report_context_tokens: int = ReportSettings().max_context_tokens
    report_max_tokens: int = ReportSettings().max_report_tokens

    def key(self) -> str:
        return f"{self.summary_max_tokens}/{self.report_context_tokens}/{self.report_max_tokens}"


def view_key(kind: str, artifact_id: str, content: str, gate: Gate, readable: frozenset[int],
             provider: str, params: ViewParams, *extra: str) -> str:
    visible = ",".join(str(c) for c in sorted(gate.acl & readable))
    return content_hash(kind, artifact_id, content, gate.sig, visible, provider, params.key(),
                        *extra, length=32)


async def _summary(reader: CallerReader, name: str, descs: list[str],
                   units: tuple[str, ...]) -> tuple[str, bool]:
    """The summary of several visible descriptions, and whether it is durable (False when the
    endpoint was down and the offline provider wrote it: then it is not cached for long)."""
    params = reader.views.params
    kept = summary_input(descs, get_tokenizer())
    provider = reader.views.provider
    memo = summary_key(provider.name, params.summary_max_tokens, name, kept,
                       prompt_key(provider, "summarize"))
    text = reader.views.store.cache_get(memo)
    if text is None:
        with cache_sources(units):  # what is cached quotes these units' descriptions
            try:
                text = await provider.summarize(name, kept, max_tokens=params.summary_max_tokens)
            except InvalidOutput:
                text = ""
            except EndpointUnavailable:
                _warn_offline()
                offline = await _offline().summarize(name, kept,
                                                     max_tokens=params.summary_max_tokens)
                return offline.strip() or " ".join(kept), False
            if text:
                reader.views.store.cache_put(memo, text)
    return text.strip() or " ".join(kept), True


async def entity_view(reader: CallerReader, entity: Entity, key: str) -> tuple[Entity | None, bool]:
    """The caller's view of `entity` from its instances in live units they can read, and
    whether it is durable; None when no such instance exists."""
    key = reader.entity_key(entity.id)
    rows = reader._snap.entity_instances([key], classes=reader.caller.readable)
    if not rows:
        return None, True
    names: Counter[str] = Counter(r.name for r in rows)
    types: Counter[str] = Counter(r.type for r in rows)
    descs = list(dict.fromkeys(r.description for r in rows if r.description))
    units = tuple(sorted({r.unit_id for r in rows}))
    name = display_name(names, key)
    description, durable = (await _summary(reader, name, descs, units)) if len(descs) > 1 else (
        descs[0] if descs else "", True)
    return Entity(entity.id, name, most_frequent(types), description, units, 0), durable


async def relationship_view(reader: CallerReader, rel: Relationship,
                            ends: dict[str, Entity]) -> tuple[Relationship | None, bool]:
    rows = reader._snap.relationship_instances([rel.id], classes=reader.caller.readable)
    if not rows or rel.source not in ends or rel.target not in ends:
        return None, True
    descs = list(dict.fromkeys(r.description for r in rows if r.description))
    weight = sum(float(r.strength) for r in rows)
    units = tuple(sorted({r.unit_id for r in rows}))
    name = f"{ends[rel.source].name} -- {ends[rel.target].name}"
    description, durable = (await _summary(reader, name, descs, units)) if len(descs) > 1 else (
        descs[0] if descs else "", True)
    return Relationship(rel.id, rel.source, rel.target, description, weight, units), durable


async def report_view(reader: CallerReader, cid: str) -> tuple[Report | None, bool]:
    """A report written from the part of community `cid` the caller can see."""
    row = reader._snap.communities([cid]).get(cid)
    if row is None:
        return None, True
    members = list(reader.members(cid))
    entities = await reader.entities(members)
    among = reader._snap.relationships_among([cid]).get(cid, [])
    relationships = {i: r for i, r in (await reader.relationships(among)).items()
                     if r.source in entities and r.target in entities}
    claims = [c for c in reader.claims_of(entities) if c.subject in entities]
    children = [k for k, s in reader.community_states(reader.child_ids([cid]).get(cid, [])).items()
                if s]
    community = Community(cid, row.level, row.parent, tuple(sorted(children)), tuple(entities),
                          tuple(sorted(relationships)), row.fingerprint)
    content = CommunityContent(community, entities, relationships, claims, {})

    async def child_reports() -> dict[str, Report]:
        kids = sorted(children)
        kid_members = {k: set(reader.members(k)) & set(entities) for k in kids}
        for k in kids:
            inside = kid_members[k]
            content.children[k] = Community(
                k,
                row.level + 1,
                cid,
                (),
                tuple(sorted(inside)),
                tuple(
                    i for i, r in relationships.items() if r.source in inside and r.target in inside
                ),
            )
        return await reader.reports(kids)

    views = reader.views
    sizes = ElementSizes(get_tokenizer())
    durable = not reader.provisional_used
    try:
        report = await write_report(content, child_reports, views.provider, sizes,
                                    context_tokens=views.params.report_context_tokens,
                                    max_tokens=views.params.report_max_tokens, fallback=_offline())
    except EndpointUnavailable:
        _warn_offline()
        report = await write_report(content, child_reports, _offline(), sizes,
                                    context_tokens=views.params.report_context_tokens,
                                    max_tokens=views.params.report_max_tokens)
        durable = False
    durable = durable and not reader.provisional_used
    if not report.text_unit_ids:
        units = sorted({u for e in entities.values() for u in e.text_unit_ids})
        report = Report(report.community_id, report.level, report.title, report.summary,
                        report.rating, report.rating_explanation, report.findings, tuple(units),
                        report.fingerprint, report.context_tokens, report.used_subreports)
    readable = reader.units(report.text_unit_ids)
    if len(readable) != len(set(report.text_unit_ids)):  # never: a guard
        raise RuntimeError(f"view of {cid} drew on units its caller cannot read")
    return report, durable


_LAST_WARNING = [0.0]
_OFFLINE_S = 60.0


def _warn_offline() -> None:
    now = time.monotonic()
    if now - _LAST_WARNING[0] > _OFFLINE_S:
        _LAST_WARNING[0] = now
        log.warning("the endpoint is down: views are written offline for now (served for a "
                    "minute, not cached)")


def _offline() -> Provider:
    from canopy.providers.builtin import BuiltinProvider

    return BuiltinProvider()

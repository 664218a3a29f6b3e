"""Revocation first (design §2): deletions and relabels take effect before any regeneration.

One short committed generation removes deleted documents and their units, gives relabelled
documents and units their new ACL class, marks every artifact derived from those units `stale`
(servable from then on only as a per-caller view of its live, readable part, or not at all), and
drops their search rows. An edited document is not touched here: readers keep its old version
until the new one commits with the rest of the update (issue 14, item 5). The regeneration that
follows rewrites every stale artifact; if it is interrupted, the stale marks tell the next run
what to finish.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter

from canopy.ids import entity_id
from canopy.indexer.stages.documents import DocumentPlan, unit_terms
from canopy.store import GraphReads, Store
from canopy.store.revocations import Revocation, commit_revocation
from canopy.store.rows import dump
from canopy.vectors import TABLES, VectorStore, merge_scrub, superseded

__all__ = ["pending_relabelled", "pending_revoked", "revoke"]

log = logging.getLogger(__name__)

def pending_revoked(store: Store) -> list[str]:
    """Units a revocation deleted whose derived rows the regeneration has not dropped yet."""
    return sorted(json.loads(store.get_meta("revoked_units", "[]") or "[]"))


def pending_relabelled(store: Store) -> list[str]:
    """Documents a revocation relabelled whose units the regeneration has not restaged yet
    (their search rows were dropped with the old class): the next run relabels them again."""
    return sorted(json.loads(store.get_meta("relabelled_documents", "[]") or "[]"))


def revoke(store: Store, plan: DocumentPlan) -> list[str]:
    """Commit the deletions and relabels of `plan` at once; returns the units deleted. They
    are also recorded (meta `revoked_units`) until the regeneration commits: what still derives
    from them (extraction instances, claims, cached responses) goes then, even if this run is
    interrupted and the next one finishes it. So are the relabelled documents (meta
    `relabelled_documents`), whose units' search rows come back only with the regeneration."""
    if not (plan.removed or plan.relabelled) or store.generation == 0:
        return []
    reads = GraphReads(store.writer)
    docs = reads.documents(plan.removed | plan.relabelled)
    units = reads.units_of_documents(plan.removed | plan.relabelled)
    unit_ids = sorted(u.unit.id for us in units.values() for u in us)
    keys, rids = store.instance_keys(unit_ids)
    # After a run interrupted between settling keys and its commit, the committed rows of these
    # units may merge under the keys their instances had before (canopy.indexer.stages.resolve)
    _, rekeyed_keys, rekeyed_rids = store.pending_rekeyed()
    keys |= rekeyed_keys
    rids |= rekeyed_rids
    entities = sorted(entity_id(k) for k in keys)
    communities = sorted(
        {c for chain in reads.memberships(entities).values() for c in chain.values()}
    )

    df: Counter[tuple[str, int]] = Counter()
    stats: Counter[tuple[int, int]] = Counter()  # (acl, 0) units, (acl, 1) terms
    for doc_id, rows in units.items():
        doc = docs[doc_id].document
        new_acl = plan.documents[doc_id].acl if doc_id in plan.documents else None
        for row in rows:
            terms = unit_terms(doc, row.unit)
            moves = [(row.acl, -1)] + ([(new_acl, 1)] if new_acl is not None else [])
            for acl, sign in moves:
                for t in set(terms):
                    df[(t, acl)] += sign
                stats[(acl, 0)] += sign
                stats[(acl, 1)] += sign * len(terms)

    deleted = sorted(u.unit.id for d in plan.removed for u in units.get(d, []))
    versions = json.loads(store.get_meta("lance_versions", "{}") or "{}")
    before = dict(versions)  # readers may hold these for the grace period
    vectors = VectorStore(store.index_dir, 0)
    vectors.restore(versions)
    dropped = {"text_units": unit_ids, "entities": entities, "reports": communities}
    for table in TABLES:
        if table in versions:
            vectors.write(table, dropped[table], [])
    versions.update({k: v for k, v in vectors.versions().items() if k in versions})

    generation = commit_revocation(store, Revocation(
        stale_entities=entities, stale_relationships=sorted(rids), units=unit_ids,
        stale_communities=communities, removed_documents=sorted(plan.removed),
        deleted_units=deleted,
        relabelled=[(doc_id, plan.documents[doc_id].document.labels, plan.documents[doc_id].acl)
                    for doc_id in sorted(plan.relabelled)],
        term_df=dict(df),
        acl_stats={acl: (stats[(acl, 0)], stats[(acl, 1)]) for acl in {a for a, _ in stats}},
        meta={"revoking": "1",
              "revoked_units": dump(sorted(set(pending_revoked(store)) | set(deleted))),
              "relabelled_documents": dump(sorted(set(pending_relabelled(store))
                                                  | plan.relabelled)),
              "lance_versions": json.dumps(versions),
              "lance_history": superseded(store.get_meta("lance_history"), before, time.time()),
              "lance_scrub": merge_scrub(store.get_meta("lance_scrub"), vectors.scrub)}))
    log.info("revoked %d documents and relabelled %d at once (generation %d): %d entities and %d "
             "communities wait for regeneration", len(plan.removed), len(plan.relabelled),
             generation, len(entities), len(communities))
    return deleted

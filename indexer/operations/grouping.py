"""The top of the hierarchy: a bounded overview that grows slowly with the corpus.

Clustering every connected component makes each small component a top-level community of its
own: 609 news articles give ~930 of them, most two or three entities extracted from one article
and linked to nothing else. Edge et al. 2024 (whose reference implementation clustered the
largest component only) read 55 at C0 for a news set of 3,197 chunks. So when the top holds more
than `top_size` candidates, only the largest stand and every other one is grafted, whole, under
the standing community it shares the most sources with:

- The signal is co-occurrence in the sources: the number of entity pairs (one from each
  community) mentioned in the same text unit, else, when the candidate shares no unit with a
  standing community, in the same document. It needs no model and no embedding, works on any
  corpus, and is what the graph's edges are (extracted co-mentions in a unit), widened to every
  co-mention and then to the document. A small component extracted from an article lands under
  the theme of the passage it came from, else of the article; in a book (one document) the
  passage decides, where the document alone would send everything under the largest community.
- A candidate that shares no source with a standing one follows one that does (as newcomers
  follow newcomers in a local update); one linked to nothing at all joins the community of the
  nearest document in path order, since folders group related documents (and, through path-glob
  rules, documents with the same ACL labels).
- Permissions: a grafted parent's provenance is the union of its members' units, so a caller who
  may not read all of them is served a view of it (canopy.acl.views) and never the canonical report;
  the grafted child stays visible to whoever may read it. Grafting by shared sources rarely
  widens a parent's labels: the unit or document the child shares is already among the
  parent's sources. So grouping is done on the whole graph, like clustering itself (design
  §2's residual channel), not per ACL class: it seldom changes what a caller is served, and a
  policy edit needs no re-clustering.

`top_size` is the larger of `max_cluster_size` and the square root of the text units (no
number fitted to a corpus). Dynamic global search rates every top-level community, then the
children of the relevant ones: T ratings at the top, and below each relevant top a fan-out that
grows with its share of the corpus, N/T units; T + N/T is least at T = sqrt(N). (The paper's
sets agree: 55 communities at C0 for 3,197 chunks of news, 34 for 1,669 of podcasts.)
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Candidate", "Sources", "TopPlan", "nearest_by_path", "plan_top", "top_size"]


def top_size(n_units: int, max_cluster_size: int, configured: int = 0) -> int:
    """The most top-level communities: `configured` when set, else
    max(max_cluster_size, ceil(sqrt(text units)))."""
    if configured:
        return configured
    return max(max_cluster_size, math.ceil(math.sqrt(max(n_units, 0))))


# entity id -> (ids of the text units that mention it, paths of their documents)
Sources = Mapping[str, tuple[Iterable[str], Iterable[str]]]


@dataclass(frozen=True)
class Candidate:
    """A top-level community (or one about to be): its key, member count, and how many of its
    members each text unit and each document mentions."""

    key: str
    size: int
    units: Counter[str] = field(default_factory=Counter)
    documents: Counter[str] = field(default_factory=Counter)

    @staticmethod
    def of(key: str, members: Iterable[str], sources: Sources) -> Candidate:
        members = list(members)
        found = [sources[m] for m in members if m in sources]
        return Candidate(key, len(members), Counter(u for us, _ in found for u in us),
                         Counter(d for _, ds in found for d in ds))


@dataclass
class TopPlan:
    """Arriving candidates that graft under a standing top-level community (`joins`: key ->
    standing key), and those no shared unit or document links to any (`orphans`, largest
    first)."""

    joins: dict[str, str]
    orphans: list[Candidate]
    owner: dict[str, str]  # every placed key -> the standing key it is (or is under)


def plan_top(standing: Sequence[Candidate], arriving: Sequence[Candidate], room: int) -> TopPlan:
    """The `room` largest arriving candidates stand (with `standing`, which always does); each
    other one joins the standing community it co-occurs with most in text units, else in
    documents, possibly through arriving ones already placed. Ties go to the smaller key."""
    order = sorted(arriving, key=lambda c: (-c.size, c.key))
    n_stand = max(room, 0)
    owner: dict[str, str] = {}
    # unit or document -> standing key -> mentions by the candidates placed under it so far: a
    # pass costs (sources of a candidate) x (standing keys), however many candidates share one
    # long document (a book is one document)
    in_unit: dict[str, Counter[str]] = defaultdict(Counter)
    in_doc: dict[str, Counter[str]] = defaultdict(Counter)

    def place(c: Candidate, top: str) -> None:
        owner[c.key] = top
        for u, n in c.units.items():
            in_unit[u][top] += n
        for d, n in c.documents.items():
            in_doc[d][top] += n

    for c in [*standing, *order[:n_stand]]:
        place(c, c.key)
    joins: dict[str, str] = {}
    pending = order[n_stand:]
    moved = True
    while pending and moved:  # a candidate may follow one placed in an earlier pass
        moved = False
        still = []
        for c in pending:
            weight = _cooccurrence(c.units, in_unit) or _cooccurrence(c.documents, in_doc)
            if weight:
                joins[c.key] = min(weight, key=lambda k: (-weight[k], k))
                place(c, joins[c.key])
                moved = True
            else:
                still.append(c)
        pending = still
    return TopPlan(joins, pending, owner)


def _cooccurrence(mine: Counter[str], placed: Mapping[str, Counter[str]]) -> Counter[str]:
    """Standing key -> pairs of entities, one of `mine` and one placed under it, mentioned in
    the same source."""
    weight: Counter[str] = Counter()
    for source, m in mine.items():
        for top, n in placed.get(source, Counter()).items():
            weight[top] += m * n
    return weight


def nearest_by_path(plan: TopPlan, candidates: Sequence[Candidate]) -> dict[str, str]:
    """Orphans of `plan` -> the standing community of the nearest document (in path order)
    that a placed candidate mentions; on a tie the earlier path wins, and within a document
    the candidate mentioning it most."""
    paths = sorted({d for c in candidates for d in c.documents})
    rank = {p: i for i, p in enumerate(paths)}
    best: dict[str, tuple[int, str]] = {}  # document -> (-mentions, key) of a placed candidate
    for c in candidates:
        if c.key in plan.owner:
            for d, n in c.documents.items():
                best[d] = min(best.get(d, (0, "\uffff")), (-n, c.key))
    covered = sorted(rank[d] for d in best)
    out: dict[str, str] = {}
    if not covered:
        return out
    for c in plan.orphans:
        near = min((_distance(covered, rank[d]) for d in c.documents), default=None)
        if near is not None:
            out[c.key] = plan.owner[best[paths[near[1]]][1]]
    return out


def _distance(covered: list[int], i: int) -> tuple[int, int]:
    """(distance, rank) of the covered rank nearest to `i`, the earlier on a tie."""
    j = bisect.bisect_left(covered, i)
    options = [(abs(covered[k] - i), covered[k]) for k in (j - 1, j) if 0 <= k < len(covered)]
    return min(options)

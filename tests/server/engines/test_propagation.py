"""local_search's multi-hop evidence (server/engines/propagation.py): a Personalized PageRank over
the entity-unit graph reaches a unit that shares an entity with the question's best unit but few
words with the question, and nothing a caller may not read is a node, a count or a bridge.

The texts are made up for these tests (none was used to tune the ranking)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from canopy.ids import entity_key
from canopy.server.context import QueryContext
from canopy.server.engines import evidence
from canopy.server.engines.local_engine import build_local_context
from canopy.server.engines.propagation import UnitGraph, graph_evidence, personalized_pagerank
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from tests.conftest import offline_env

# The merge keys of the corpus's names, as the reader is asked for them.
ALMANAC, SOCIETY, PIET, MARA = (entity_key(n) for n in (
    "Harbor Almanac", "Quillmoor Society", "Piet Oss", "Mara Holt"))

QUESTION = "Who was the first president of the guild that prints the Harbor Almanac?"

DOCS = {
    "almanac.md": "# Harbor Almanac\n\nThe Harbor Almanac is printed every spring by the "
                  "Quillmoor Society in Port Edna. Its tide tables cover the whole coast.\n",
    "society.md": "# Tide watchers\n\nThe Quillmoor Society was founded in 1881. Odile Varga "
                  "was its first president.\n",
    # Distractors: the bridging unit's words about the question, in a slightly shorter unit
    # (so full-text search ranks them first), and no entity shared with the almanac's unit.
    "lantern.md": "# Lanterns\n\nThe Lantern Club was founded in 1890. Piet Oss was its "
                  "first president.\n",
    "rowing.md": "# Rowing\n\nThe Rowing Club was founded in 1902. Mara Holt was its first "
                 "president.\n",
}
# Under the policy, "society.md" (the only bridge) is readable by admin only; "copy.md", also
# admin's, names the Quillmoor Society beside Port Edna, a second path between the two.
POLICY = """
[acl]
default = ["staff"]

[[acl.rules]]
glob = "society.md"
labels = ["board"]

[[acl.rules]]
glob = "copy.md"
labels = ["board"]

[acl.principals]
admin = ["staff", "board"]
bob = ["staff"]
"""


def _build(root: Path, docs: dict[str, str], policy: str | None = None) -> CanopyService:
    folder = root / "docs"
    folder.mkdir(parents=True)
    for name, text in docs.items():
        (folder / name).write_text(text, encoding="utf-8")
    if policy:
        (folder / "canopy.toml").write_text(policy, encoding="utf-8")
    ws = open_workspace(folder, root / "index")
    build_index(ws)
    return CanopyService(ws)


@pytest.fixture(scope="module", autouse=True)
def _offline() -> Iterator[None]:
    with offline_env():
        yield


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanopyService]:
    svc = _build(tmp_path_factory.mktemp("plain"), DOCS)
    yield svc
    svc.close()


def _documents(ctx: QueryContext, query: str) -> list[str]:
    """The documents of local_search's text units, in context order."""
    blocks = asyncio.run(build_local_context(ctx, query, budget=8000)).blocks
    units = ctx.reader.units(b.id for b in blocks if b.kind == "text_unit")
    return list(dict.fromkeys(doc.path for _, doc in units.values()))


class TestTwoHops:
    def test_the_bridging_unit_is_ranked_second_through_the_entity_it_shares(self, plain):
        with plain.context(None) as ctx:
            assert _documents(ctx, QUESTION)[:2] == ["almanac.md", "society.md"]

    def test_without_the_propagation_the_distractors_rank_before_it(self, plain, monkeypatch):
        monkeypatch.setattr(evidence, "GRAPH_WEIGHT", 0.0)
        with plain.context(None) as ctx:
            docs = _documents(ctx, QUESTION)
        assert docs[0] == "almanac.md"
        assert "society.md" not in docs[:2]

    def test_the_walk_reaches_the_bridge_from_the_question_entity_alone(self, plain):
        with plain.context(None) as ctx:
            r = ctx.reader
            scores = personalized_pagerank(UnitGraph(r), {ALMANAC: 1.0}, {})
            paths = {u: doc.path for u, (_, doc) in r.units(scores).items()}
        assert set(paths.values()) == {"almanac.md", "society.md"}
        best = max(scores, key=lambda u: scores[u])
        assert paths[best] == "almanac.md"  # the unit naming the seed keeps the most

    def test_a_seed_units_own_weight_is_not_its_graph_evidence(self, plain):
        """Every unit seeded alike: the bridge, reached from the almanac's unit, has more graph
        evidence than units that only lead back to themselves."""
        with plain.context(None) as ctx:
            r = ctx.reader
            every = r.units(u for ids in r.mentioning_units(
                [ALMANAC, SOCIETY, PIET, MARA]).values()
                for u in ids)
            got = graph_evidence(r, [], dict.fromkeys(every, 1.0))
            by_path = {doc.path: got.get(u, 0.0) for u, (_, doc) in every.items()}
        assert by_path["society.md"] > 3 * max(by_path["lantern.md"], by_path["rowing.md"])


class TestPermissions:
    @pytest.fixture(scope="class")
    def guarded(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanopyService]:
        docs = {**DOCS, "copy.md": "# Notes\n\nThe Quillmoor Society met in Port Edna.\n"}
        svc = _build(tmp_path_factory.mktemp("guarded"), docs, POLICY)
        yield svc
        svc.close()

    @pytest.fixture(scope="class")
    def without_hidden(self, tmp_path_factory: pytest.TempPathFactory
                       ) -> Iterator[CanopyService]:
        """The same corpus without the documents bob may not read."""
        svc = _build(tmp_path_factory.mktemp("public"),
                     {k: v for k, v in DOCS.items() if k != "society.md"})
        yield svc
        svc.close()

    def test_graph_reads_count_and_return_only_units_the_caller_may_read(self, guarded):
        with guarded.context("admin") as admin, guarded.context("bob") as bob:
            assert admin.reader.mention_counts([SOCIETY]) == {SOCIETY: 3}
            assert bob.reader.mention_counts([SOCIETY]) == {SOCIETY: 1}
            seen = bob.reader.mentioning_units([SOCIETY])[SOCIETY]
            assert {d.path for _, d in bob.reader.units(seen).values()} == {"almanac.md"}
            hidden = [u for u, (_, d) in admin.reader.units(
                admin.reader.mentioning_units([SOCIETY])[SOCIETY]
            ).items() if d.path != "almanac.md"]
            assert hidden and bob.reader.unit_mentions(hidden) == {}

    def test_a_hidden_unit_moves_no_score_for_a_caller_who_may_not_read_it(self, guarded,
                                                                          without_hidden):
        """bob's graph evidence and ranking are those of an index that never had the hidden
        documents: scores, not only ids, so no count or weight betrays them."""

        def evidence_by_path(svc: CanopyService, principal: str | None
                             ) -> tuple[dict[tuple[str, int], float], list[str]]:
            with svc.context(principal) as ctx:
                r = ctx.reader
                units = {u: (t, d) for u, (t, d) in r.units(
                    h.id for h in asyncio.run(
                        r.search("text_units", vector=None, text=QUESTION, k=50))
                ).items()}
                seeds = {u: 1.0 + i for i, u in enumerate(sorted(units, key=lambda u: (
                    units[u][1].path, units[u][0].ordinal)))}
                keys = [ALMANAC, SOCIETY]
                got = graph_evidence(r, keys, seeds)
                located = r.units(got)
                ev = {(located[u][1].path, located[u][0].ordinal): round(g, 9)
                      for u, g in got.items()}
                return ev, _documents(ctx, QUESTION)

        bob_evidence, bob_docs = evidence_by_path(guarded, "bob")
        public_evidence, public_docs = evidence_by_path(without_hidden, None)
        assert bob_evidence == public_evidence
        assert bob_docs == public_docs
        assert "society.md" not in bob_docs and "copy.md" not in bob_docs


class TestEntityPages:
    """A document titled by a name is that entity's page: when the walk from the question
    reaches the entity, its page is evidence even if it shares few words with the question."""

    QUESTION = "Who is the president of the country whose capital the Dunmere Tramway crosses?"
    DOCS = {
        "tramway.md": "# Dunmere Tramway\n\nThe Dunmere Tramway crosses Dunmere, the capital "
                      "of Ostrevia, from the river to the hills. It opened in 1911.\n",
        "ostrevia.md": "# Ostrevia\n\nOstrevia is a landlocked republic in the Pell valley. "
                       "Halvard Munk has been its president since 2019. Ostrevia exports "
                       "timber and glass.\n",
        # Distractors: two of the question's words where the page has one, no entity of the
        # tramway's unit.
        "chess.md": "# Notes from the chess evening\n\nThe chess club of Brellin elects a "
                    "president every year from the best players of the country.\n",
        "rowing.md": "# Minutes of the rowing meeting\n\nThe rowing club of Saltby named a new "
                     "president. Its crew is the best in the country.\n",
        "choir.md": "# A season of singing\n\nThe choir of Wendel chose its president in March "
                    "before the country tour.\n",
    }

    @pytest.fixture(scope="class")
    def pages(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanopyService]:
        svc = _build(tmp_path_factory.mktemp("pages"), self.DOCS)
        yield svc
        svc.close()

    def test_the_page_of_the_entity_the_walk_reaches_ranks_second(self, pages):
        with pages.context(None) as ctx:
            assert _documents(ctx, self.QUESTION)[:2] == ["tramway.md", "ostrevia.md"]

    def test_without_page_credit_the_distractors_rank_before_it(self, pages, monkeypatch):
        monkeypatch.setattr(evidence, "PAGE_WEIGHT", 0.0)
        with pages.context(None) as ctx:
            assert "ostrevia.md" not in _documents(ctx, self.QUESTION)[:2]

    def test_only_a_title_that_is_a_name_makes_a_page(self):
        assert evidence.page_key("Ostrevia") == "ostrevia"
        assert evidence.page_key("Tallow Street (novel)") == entity_key("tallow street")
        assert evidence.page_key("Notes from the chess evening") == ""
        assert evidence.page_key("Why commuters quit the ferry?") == ""

"""Incremental indexing equals a rebuild, costs what changed, and survives kill -9 (design §4)."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from canopy.indexer.operations.clustering import is_partition
from canopy.providers.builtin.text import sentence_terms
from canopy.server.runtime import build_index, open_workspace
from canopy.store import Store
from canopy.store.export import Graph, load_graph
from tests.conftest import EXAMPLES, REPO, carol_text, news_articles


def graph_of(index_dir: Path) -> Graph:
    store = Store(index_dir)
    try:
        return load_graph(store)
    finally:
        store.close()


def canonical(index_dir: Path) -> dict[str, Any]:
    """The index with document ids factored out (a renamed file keeps its id incrementally but
    gets a path-derived one in a fresh build): units by (path, text), provenance likewise."""
    g = graph_of(index_dir)
    key = {u.id: (g.documents[u.document_id].path, u.text) for u in g.units.values()}

    def prov(ids: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(key[i] for i in ids))

    return {
        "documents": sorted((d.path, d.content_hash, d.labels) for d in g.documents.values()),
        "units": sorted(key.values()),
        "entities": sorted((e.id, e.name, e.type, e.description, e.degree, prov(e.text_unit_ids))
                           for e in g.entities.values()),
        "relationships": sorted((r.id, r.source, r.target, r.description, r.weight,
                                 prov(r.text_unit_ids))
                                for r in g.relationships.values()),
        "claims": sorted((c.subject, c.object, c.type, c.status, c.description, c.start_date,
                          c.end_date, c.quote, prov(c.text_unit_ids))
                         for c in g.claims.values()),
    }


def assert_community_invariants(index_dir: Path) -> None:
    """Every level partitions the entities; children nest in their parent one level down;
    stored sizes match; every community has a current report drawn from live units; nothing is
    left stale."""
    g = graph_of(index_dir)
    for level in sorted({c.level for c in g.communities.values()}):
        part = [c.entity_ids for c in g.communities.values()
                if c.level == level or (c.level < level and not c.children)]
        assert is_partition(part, set(g.entities)), f"level {level} is not a partition"
    for c in g.communities.values():
        row = g.community_rows[c.id]
        assert (row.n_members, row.n_children) == (len(c.entity_ids), len(c.children))
        assert not row.gate.stale
        for k in c.children:
            assert set(g.communities[k].entity_ids) <= set(c.entity_ids)
            assert g.communities[k].level == c.level + 1
    # The modularity guard's root aggregates, kept up to date incrementally, equal their sums.
    s_in = s_d2 = 0.0
    for c in g.communities.values():
        if c.parent is None:
            inside = set(c.entity_ids)
            ends = [((r.source in inside) + (r.target in inside), r.weight)
                    for r in g.relationships.values()]
            w_in = sum(w for n, w in ends if n == 2)
            d_tot = sum(n * w for n, w in ends)
            row = g.community_rows[c.id]
            assert (row.w_in, row.d_tot) == pytest.approx((w_in, d_tot), abs=1e-6), c.id
            s_in, s_d2 = s_in + w_in, s_d2 + d_tot ** 2
    store = Store(index_dir)
    try:
        # Serving's orderings, kept up to date incrementally, hold every relationship among each
        # community's members with its weight and every member with its degree and name.
        with store.snapshot() as snap:
            edges = sorted(snap.db.execute(
                "SELECT relationship_id, community_id, weight FROM community_edges").fetchall())
            ranks = sorted(snap.db.execute(
                "SELECT entity_id, community_id, degree, name FROM member_ranks").fetchall())
            analyses = snap.db.execute("SELECT text, sentence_terms FROM text_units").fetchall()
        # Each unit's stored analysis, written with it, is its text's (local_search reads it).
        assert analyses and all(stored == sentence_terms(text) for text, stored in analyses)
        inside = {c.id: set(c.entity_ids) for c in g.communities.values()}
        assert edges == sorted((r.id, c, r.weight) for r in g.relationships.values()
                               for c, m in inside.items() if {r.source, r.target} <= m)
        assert ranks == sorted((e, c, g.entities[e].degree, g.entities[e].name)
                               for c, m in inside.items() for e in m)
        assert float(store.get_meta("s_in") or 0) == pytest.approx(s_in, abs=1e-6)
        assert float(store.get_meta("s_d2") or 0) == pytest.approx(s_d2, abs=1e-6)
        total = sum(r.weight for r in g.relationships.values())
        assert float(store.get_meta("m_total") or 0) == pytest.approx(total, abs=1e-6)
    finally:
        store.close()
    assert set(g.reports) == set(g.communities)
    for r in g.reports.values():
        assert r.text_unit_ids and set(r.text_unit_ids) <= set(g.units)
        assert r.fingerprint == g.communities[r.community_id].fingerprint


class Corpus:
    """A small folder of documents mutated by seeded random add/edit/rename/delete steps."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        shutil.copytree(EXAMPLES / "projects", root / "projects")
        shutil.copytree(EXAMPLES / "suppliers", root / "suppliers")
        paras = [p for p in carol_text().split("\n\n") if len(p) > 200]
        self.pool = [paras[i : i + 6] for i in range(0, 120, 6)]
        self.added = 0

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*.*") if ".canopy" not in p.parts and p.is_file())

    def step(self) -> str:
        op = self.rng.choice(["add", "edit", "rename", "delete"])
        files = self.files()
        if op == "add" or len(files) < 3:
            self.added += 1
            (self.root / f"added_{self.added}.md").write_text(
                "\n\n".join(self.rng.choice(self.pool)), encoding="utf-8"
            )
            return "add"
        victim = self.rng.choice(files)
        if op == "edit":
            paras = victim.read_text(encoding="utf-8").split("\n\n")
            i = self.rng.randrange(len(paras))
            paras[i] = paras[i] + " Later, Maria Okafor visited Lisbon with Ebenezer Scrooge."
            victim.write_text("\n\n".join(paras), encoding="utf-8")
        elif op == "rename":
            victim.rename(victim.with_name("renamed_" + victim.name))
        else:
            victim.unlink()
        return op


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_edit_sequences_give_the_same_graph_as_a_fresh_build(
    tmp_path: Path, seed: int
) -> None:
    corpus = Corpus(tmp_path / "docs", seed)
    ws = open_workspace(corpus.root, index_dir=tmp_path / "incremental")
    build_index(ws)
    ops = [corpus.step() for _ in range(4)]
    for _ in range(2):
        build_index(ws)
    fresh = open_workspace(corpus.root, index_dir=tmp_path / "fresh")
    build_index(fresh)
    assert canonical(ws.index_dir) == canonical(fresh.index_dir), f"ops {ops}"
    assert_community_invariants(ws.index_dir)


def test_with_claims_on_random_edits_give_the_same_claims_as_a_fresh_build(
    tmp_path: Path,
) -> None:
    """The builtin extractor's claims (with their quotes and any period) follow edits too."""
    corpus = Corpus(tmp_path / "docs", 5)
    ws = open_workspace(corpus.root, index_dir=tmp_path / "incremental", extract={"claims": True})
    build_index(ws)
    ops = [corpus.step() for _ in range(4)]
    build_index(ws)
    fresh = open_workspace(corpus.root, index_dir=tmp_path / "fresh", extract={"claims": True})
    build_index(fresh)
    got = canonical(ws.index_dir)
    # (a sentence the builtin extractor cleaned of markdown is not verbatim: no quote)
    assert any(c[7] for c in got["claims"]), "no claim with a quote: the test would be vacuous"
    assert got == canonical(fresh.index_dir), f"ops {ops}"


def test_each_step_applied_one_at_a_time_also_matches(tmp_path: Path) -> None:
    corpus = Corpus(tmp_path / "docs", 11)
    ws = open_workspace(corpus.root, index_dir=tmp_path / "incremental")
    build_index(ws)
    for _ in range(5):
        corpus.step()
        build_index(ws)
        assert_community_invariants(ws.index_dir)
    fresh = open_workspace(corpus.root, index_dir=tmp_path / "fresh")
    build_index(fresh)
    assert canonical(ws.index_dir) == canonical(fresh.index_dir)


def test_an_edit_removing_a_merges_only_evidence_splits_the_entity_like_a_fresh_build(
    tmp_path: Path,
) -> None:
    """Issue 31: "Altman" merges into "Sam Altman" on the unit that names both; an edit that
    removes the full name from that unit splits them again, exactly as a fresh build does, and
    so does restoring it."""
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "projects", docs / "projects")
    note = docs / "interview.md"
    full = ("# Interview\n\nSam Altman spoke to Maria Okafor in Lisbon about Helio Cells. "
            "Later Altman met Maria Okafor again, and Altman praised Helio Cells.\n")
    note.write_text(full, encoding="utf-8")
    ws = open_workspace(docs, index_dir=tmp_path / "incremental")
    build_index(ws)

    def names(index_dir: Path) -> dict[str, str]:
        return {e.name: e.id for e in graph_of(index_dir).entities.values()}

    assert "Sam Altman" in names(ws.index_dir) and "Altman" not in names(ws.index_dir)
    for text, merged in ((full.replace("Sam Altman spoke", "A reporter spoke"), False),
                         (full, True)):
        note.write_text(text, encoding="utf-8")
        build_index(ws)
        assert ("Altman" not in names(ws.index_dir)) == merged
        fresh = open_workspace(docs, index_dir=tmp_path / f"fresh-{merged}")
        build_index(fresh)
        assert canonical(ws.index_dir) == canonical(fresh.index_dir)
        assert_community_invariants(ws.index_dir)


_TALKS = ("# Trade talks\n\nThe Federal Bureau of Investigation opened an inquiry with Norway in "
          "Brussels on Monday. Officials of the Federal Bureau of Investigation and Norway met "
          "Maria Okafor, the Norwegian envoy, at the summit hall in Brussels, where Maria Okafor "
          "praised the offer.\n\n")
_LATER = ("Later that week the FBI sent a second offer to Norway. The FBI expects Norway to "
          "answer before June, and Okafor said Norway would study the offer of the FBI with care "
          "in Oslo.\n")
_NOTES = "# Notes\n\nThe FBI rules on fishing annoy Norway. Okafor runs a shop in Oslo.\n"
_SMALL_UNITS = {"chunk_tokens": 60, "overlap_tokens": 0}


def _keys_by_path(index_dir: Path) -> dict[tuple[str, str], set[str]]:
    """The keys each (document, written name) merges by."""
    with sqlite3.connect(index_dir / "canopy.sqlite") as db:
        rows = db.execute(
            "SELECT d.path, i.name, i.key FROM entity_instances i JOIN text_units u "
            "ON u.id = i.unit_id JOIN documents d ON d.id = u.document_id").fetchall()
    out: dict[tuple[str, str], set[str]] = {}
    for path, name, key in rows:
        out.setdefault((path, name), set()).add(key)
    return out


def test_a_short_form_merges_with_the_long_name_of_another_unit_of_its_document(
    tmp_path: Path,
) -> None:
    """Issue 31: "FBI" and "Okafor" in one unit of talks.md, "Federal Bureau of Investigation"
    and "Maria Okafor" in another: one entity each, the document being the evidence; the same
    short forms in notes.md, which names neither long form, stay entities of their own."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "talks.md").write_text(_TALKS + _LATER, encoding="utf-8")
    (docs / "notes.md").write_text(_NOTES, encoding="utf-8")
    ws = open_workspace(docs, index_dir=tmp_path / "idx", chunking=_SMALL_UNITS)
    build_index(ws)
    g = graph_of(ws.index_dir)
    talks = next(d.id for d in g.documents.values() if d.path == "talks.md")
    assert len([u for u in g.units.values() if u.document_id == talks]) == 2
    keys = _keys_by_path(ws.index_dir)
    assert keys[("talks.md", "FBI")] == {"federalbureauofinvestigation"}
    assert keys[("talks.md", "Okafor")] == {"mariaokafor"}
    assert keys[("notes.md", "FBI")] == {"fbi"}
    fbi = {e.name: e for e in g.entities.values()}
    assert {g.units[u].document_id for u in fbi["FBI"].text_unit_ids} == {
        next(d.id for d in g.documents.values() if d.path == "notes.md")}


def _talks_and_notes_built(tmp_path: Path) -> tuple[Path, Path, Any]:
    """talks.md (its second unit's "FBI" linked through its first) and notes.md, indexed in
    small units: the folder, talks.md and the workspace."""
    docs = tmp_path / "docs"
    docs.mkdir()
    talks = docs / "talks.md"
    talks.write_text(_TALKS + _LATER, encoding="utf-8")
    (docs / "notes.md").write_text(_NOTES, encoding="utf-8")
    ws = open_workspace(docs, index_dir=tmp_path / "incremental", chunking=_SMALL_UNITS)
    build_index(ws)
    return docs, talks, ws


def test_an_edit_removing_the_only_long_name_unit_splits_the_documents_names_like_a_fresh_build(
    tmp_path: Path,
) -> None:
    """The unit that links "FBI" of talks.md's second unit is edited to name no Federal Bureau
    of Investigation nor Maria Okafor: the second unit, unchanged and not extracted again, gets
    its own keys back ("FBI" merges with notes.md's), exactly as in a fresh build; restoring
    the text merges them again."""
    docs, talks, ws = _talks_and_notes_built(tmp_path)
    edited = (_TALKS.replace("Federal Bureau of Investigation", "harbour office")
              .replace("Maria Okafor", "the envoy") + _LATER)
    for step, (text, merged) in enumerate(((edited, False), (_TALKS + _LATER, True))):
        talks.write_text(text, encoding="utf-8")
        result = build_index(ws)
        assert result.stats["units_extracted"] == 1  # the edited unit alone
        keys = _keys_by_path(ws.index_dir)
        assert (keys[("talks.md", "FBI")] == {"federalbureauofinvestigation"}) == merged
        assert (keys[("talks.md", "Okafor")] == {"mariaokafor"}) == merged
        fresh = open_workspace(docs, index_dir=tmp_path / f"fresh-{step}", chunking=_SMALL_UNITS)
        build_index(fresh)
        assert canonical(ws.index_dir) == canonical(fresh.index_dir)
        assert _keys_by_path(ws.index_dir) == _keys_by_path(fresh.index_dir)
        assert_community_invariants(ws.index_dir)


def test_a_run_interrupted_after_settling_keys_is_finished_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keys are settled outside the generation; when the run stops before its commit, the
    next one (which finds them already settled) still merges the entities they had."""
    import canopy.indexer.pipeline as pipeline

    docs, talks, ws = _talks_and_notes_built(tmp_path)
    talks.write_text(_TALKS.replace("Federal Bureau of Investigation", "harbour office") + _LATER,
                     encoding="utf-8")

    async def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(pipeline, "stage_graph", killed)
        with pytest.raises(KeyboardInterrupt):
            build_index(ws)
    build_index(ws)
    fresh = open_workspace(docs, index_dir=tmp_path / "fresh", chunking=_SMALL_UNITS)
    build_index(fresh)
    assert canonical(ws.index_dir) == canonical(fresh.index_dir)
    assert_community_invariants(ws.index_dir)


@pytest.mark.parametrize(("seed", "migration", "undo"), [
    # community_edges and member_ranks: filled from the committed generation
    (5, "m008_community_index", ("DROP TABLE community_edges", "DROP TABLE member_ranks")),
    # text_units.sentence_terms: every committed unit's text is analysed
    (6, "m009_sentence_terms", ("ALTER TABLE text_units DROP COLUMN sentence_terms",)),
    # instances' unit keys: the keys they merge by (an index before it keyed by unit alone)
    (7, "m012_unit_keys", ("ALTER TABLE entity_instances DROP COLUMN unit_key",
                           "ALTER TABLE relationship_instances DROP COLUMN unit_source",
                           "ALTER TABLE relationship_instances DROP COLUMN unit_target",
                           "ALTER TABLE claim_instances DROP COLUMN unit_subject",
                           "ALTER TABLE claim_instances DROP COLUMN unit_object")),
])
def test_an_index_from_before_a_migration_gets_what_it_adds_and_keeps_it_current(
        tmp_path: Path, seed: int, migration: str, undo: tuple[str, ...]) -> None:
    corpus = Corpus(tmp_path / "docs", seed)
    ws = open_workspace(corpus.root, index_dir=tmp_path / "incremental")
    build_index(ws)
    db = sqlite3.connect(ws.index_dir / "canopy.sqlite")
    assert db.execute("SELECT COUNT(*) FROM community_edges").fetchone()[0] > 0
    for statement in undo:
        db.execute(statement)
    db.execute("DELETE FROM _migrations WHERE name = ?", (migration,))
    db.commit()
    db.close()
    Store(ws.index_dir).close()  # migrates
    assert_community_invariants(ws.index_dir)
    for _ in range(3):
        corpus.step()
        build_index(ws)
        assert_community_invariants(ws.index_dir)


def test_a_full_rebuild_over_an_index_keeps_the_reports_it_reuses(tmp_path: Path) -> None:
    """Regression: `canopy index --full` over an existing index reused every unchanged report
    by id and fingerprint without staging it, and a full build commits over emptied tables, so
    the rebuilt index had communities and no reports."""
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    again = build_index(ws, full=True)
    assert again.stats["reports_reused"] > 0
    assert_community_invariants(ws.index_dir)


def _tops(index_dir: Path) -> int:
    return sum(c.parent is None for c in graph_of(index_dir).communities.values())


def test_a_bounded_top_holds_through_updates_like_in_a_fresh_build(tmp_path: Path) -> None:
    """With more top-level candidates than `max_top_level`, the top stays within it after
    added, edited, renamed and deleted documents (new components are grafted under the
    community they share documents with, where an unbounded index gains top-level ones), every
    invariant holds, and the graph equals a fresh build's."""
    corpus = Corpus(tmp_path / "docs", 10)  # add, delete, add, then delete
    bound = {"max_top_level": 3}
    unbounded = open_workspace(corpus.root, index_dir=tmp_path / "unbounded")
    ws = open_workspace(corpus.root, index_dir=tmp_path / "incremental", communities=bound)
    build_index(unbounded)
    build_index(ws)
    free = [_tops(unbounded.index_dir)]
    assert free[0] > 6 and _tops(ws.index_dir) == 3  # the bound has work to do
    ops = []
    for _ in range(3):
        ops.append(corpus.step())
        build_index(unbounded)
        build_index(ws)
        free.append(_tops(unbounded.index_dir))
        assert _tops(ws.index_dir) <= 3, ops
        assert_community_invariants(ws.index_dir)
    assert any(b > a for a, b in itertools.pairwise(free)), (ops, free)  # new components came
    fresh = open_workspace(corpus.root, index_dir=tmp_path / "fresh", communities=bound)
    build_index(fresh)
    assert _tops(fresh.index_dir) == 3
    assert canonical(ws.index_dir) == canonical(fresh.index_dir)
    corpus.step()  # the unbounded index, updated under the bound, catches up with it
    build_index(open_workspace(corpus.root, index_dir=unbounded.index_dir, communities=bound))
    assert _tops(unbounded.index_dir) == 3
    assert_community_invariants(unbounded.index_dir)


def test_an_edit_reextracts_only_the_changed_units_and_a_noop_does_nothing(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "carol.txt").write_text(carol_text(), encoding="utf-8")
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    first = build_index(ws)
    noop = build_index(ws)
    assert noop.stats["units_extracted"] == 0 and noop.stats["reports_generated"] == 0
    assert noop.stats["embedded"] == 0
    text = carol_text().split("\n\n")
    i = len(text) // 2
    text[i] = text[i] + " An editor added this sentence about Jacob Marley."
    (docs / "carol.txt").write_text("\n\n".join(text), encoding="utf-8")
    edit = build_index(ws)
    assert 1 <= edit.stats["units_extracted"] <= 2
    assert edit.stats["reports_generated"] < first.stats["reports_generated"] / 2


def test_a_rename_reuses_units_extractions_and_reports(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    before = canonical(ws.index_dir)
    (docs / "helio_cells.md").rename(docs / "helio-cells-ltd.md")
    result = build_index(ws)
    assert result.stats["units_extracted"] == 0
    assert result.stats["reports_generated"] == 0
    after = canonical(ws.index_dir)
    assert len(after["units"]) == len(before["units"]) and after["entities"] != []


def test_a_policy_edit_relabels_units_without_reextraction(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    first = build_index(ws)
    (docs / "canopy.toml").write_text(
        '[acl]\ndefault = ["staff"]\n[[acl.rules]]\nglob = "finance/**"\nlabels = ["finance"]\n',
        encoding="utf-8",
    )
    result = build_index(open_workspace(docs, index_dir=tmp_path / "idx"))
    assert result.stats["units_extracted"] == 0
    # Every document's class changed (a default appeared), so every search row is written
    # again: the hashing embedder, uncached, hashes the same texts afresh (an endpoint's vectors
    # come from the embedding cache: test_embeddings_ahead)
    assert result.stats["embedded"] == first.stats["embedded"]
    labels = {d.path: d.labels for d in graph_of(ws.index_dir).documents.values()}
    assert labels["finance/budget_2025.md"] == ("finance",)
    assert labels["overview.md"] == ("staff",)


def _spawn_index(docs: Path, index_dir: Path, base_url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CANOPY_LLM_BASE_URL": base_url, "CANOPY_LLM__CONCURRENCY": "2",
           "CANOPY_LLM__BACKOFF_S": "0.01", "CANOPY_EXTRACT__MAX_GLEANINGS": "0"}
    return subprocess.Popen([sys.executable, "-m", "canopy.server.cli", "index", str(docs),
                             "--index-dir", str(index_dir)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_kill_9_mid_update_then_rerun_equals_a_clean_build(tmp_path: Path) -> None:
    from tests.fakes.openai_server import FakeOpenAI

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    llm = {"max_retries": 2, "backoff_s": 0.01}
    with FakeOpenAI(latency=0.05) as fake:
        proc = _spawn_index(docs, tmp_path / "killed", fake.base_url)
        deadline = time.monotonic() + 60
        while fake.count("extract") < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert proc.poll() is None, "indexing finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        resumed = open_workspace(docs, index_dir=tmp_path / "killed",
                                 llm={"base_url": fake.base_url, **llm},
                                 extract={"max_gleanings": 0})
        result = build_index(resumed)
        # Extractions finished before the kill were kept and not requested again.
        assert result.stats["units_extracted"] < result.stats["text_units"]
    with FakeOpenAI() as fake2:
        clean = open_workspace(docs, index_dir=tmp_path / "clean",
                               llm={"base_url": fake2.base_url, **llm},
                               extract={"max_gleanings": 0})
        build_index(clean)
    assert canonical(resumed.index_dir) == canonical(clean.index_dir)
    assert_community_invariants(resumed.index_dir)


def test_an_update_interrupted_after_revocation_is_completed_by_the_next_run(
    tmp_path: Path,
) -> None:
    """Deletion commits first; if regeneration then fails, a rerun must finish it, not skip."""
    import asyncio

    from canopy.errors import EndpointUnavailable
    from canopy.indexer.pipeline import run_index
    from canopy.providers import make_embedder
    from canopy.providers.builtin import BuiltinProvider

    class ReportsDown(BuiltinProvider):
        async def report(self, context, *, max_tokens):  # type: ignore[no-untyped-def]
            raise EndpointUnavailable("LLM endpoint down (test)")

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    (docs / "helio_cells.md").unlink()
    store = Store(ws.index_dir)
    try:
        with pytest.raises(EndpointUnavailable):
            asyncio.run(
                run_index(docs, store, ws.settings, ReportsDown(), make_embedder(ws.settings))
            )
        assert "helio_cells.md" not in {d.path for d in load_graph(store).documents.values()}
    finally:
        store.close()
    result = build_index(ws)
    assert not result.stats.get("noop")
    fresh = open_workspace(docs, index_dir=tmp_path / "fresh")
    build_index(fresh)
    assert canonical(ws.index_dir) == canonical(fresh.index_dir)
    assert_community_invariants(ws.index_dir)


def test_when_the_guard_reclusters_nothing_of_the_local_update_remains(tmp_path: Path) -> None:
    """The modularity guard replaces the locally updated hierarchy with a fresh clustering: every
    community the local update had staged must go with it (a partition, not a mixture)."""
    corpus = Corpus(tmp_path / "docs", 5)
    ws = open_workspace(corpus.root, index_dir=tmp_path / "incremental")
    build_index(ws)
    for _ in range(3):
        corpus.step()
        store = Store(ws.index_dir)
        try:
            store.set_meta({"q_reference": "1.0"})  # any local update now falls short of it
        finally:
            store.close()
        build_index(ws)
        assert_community_invariants(ws.index_dir)
        store = Store(ws.index_dir)
        try:
            assert float(store.get_meta("q_reference") or 0) < 1.0  # a fresh clustering ran
        finally:
            store.close()
    fresh = open_workspace(corpus.root, index_dir=tmp_path / "fresh")
    build_index(fresh)
    assert canonical(ws.index_dir) == canonical(fresh.index_dir)


def test_reports_written_in_small_member_chunks_equal_one_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Top levels are read a bounded number of members at a time: cutting every level into
    tiny chunks changes nothing in the communities or reports."""
    import canopy.indexer.stages.reports as stage

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    whole = open_workspace(docs, index_dir=tmp_path / "whole")
    build_index(whole)
    monkeypatch.setattr(stage, "_CHUNK_MEMBERS", 3)
    chunks: list[int] = []
    original = stage._chunk

    async def counting(b: Any, h: Any, ids: list[str], *args: Any) -> None:
        chunks.append(len(ids))
        await original(b, h, ids, *args)

    monkeypatch.setattr(stage, "_chunk", counting)
    small = open_workspace(docs, index_dir=tmp_path / "small")
    build_index(small)
    a, b = graph_of(whole.index_dir), graph_of(small.index_dir)
    assert len(chunks) > len(a.communities) // stage._CHUNK + 1  # the bound did cut chunks
    assert {c.id: c.fingerprint for c in a.communities.values()} == \
        {c.id: c.fingerprint for c in b.communities.values()}
    assert {r.community_id: (r.title, r.summary) for r in a.reports.values()} == \
        {r.community_id: (r.title, r.summary) for r in b.reports.values()}


def test_an_update_counts_the_token_sizes_of_changed_elements_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Report contexts rank elements by token size; sizes counted by one run are stored by
    element hash, so an update tokenizes only the elements it changed, however large the
    communities whose reports it rewrites."""
    from canopy.indexer.operations.report_context import ElementSizes

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    ws = open_workspace(docs, index_dir=tmp_path / "index")
    build_index(ws)

    def hashes() -> dict[str, str]:
        store = Store(tmp_path / "index")
        try:
            return dict(store.writer.execute(
                "SELECT id, hash FROM entities UNION ALL SELECT id, hash FROM relationships"))
        finally:
            store.close()

    before = hashes()
    counted: set[str] = set()  # elements tokenized (a size neither stored nor counted yet)

    def spying(real: Any) -> Any:
        def spy(self: ElementSizes, element: Any) -> int:
            if not self.known(element.id):
                counted.add(element.id)
            return int(real(self, element))
        return spy

    monkeypatch.setattr(ElementSizes, "entity", spying(ElementSizes.entity))
    monkeypatch.setattr(ElementSizes, "relationship", spying(ElementSizes.relationship))
    target = docs / "projects" / "kestrel.md"
    target.write_text(target.read_text(encoding="utf-8")
                      + "\n\nMaria Okafor met Tomas Reyes of Bluewater Logistics in Porto.\n",
                      encoding="utf-8")
    build_index(ws)
    after = hashes()
    changed = {i for i, h in after.items() if before.get(i) != h}
    assert counted and counted <= changed


def _written_from_reports_alone(g: Graph, budget: int) -> set[str]:
    """Ids of the communities whose reports the rule writes from their children's reports
    alone (canopy.indexer.operations.report_context), each checked: fingerprint, ACL classes and
    report follow from
    its children."""
    from canopy.indexer.operations.report_context import (
        ElementSizes,
        reports_only,
        reports_only_fingerprint,
    )
    from canopy.tokenizer import get_tokenizer

    tok = get_tokenizer()
    sizes = ElementSizes(tok)
    out = set()
    for c in g.communities.values():
        if not c.children or sum(sizes.entity(g.entities[e]) for e in c.entity_ids) <= budget:
            continue  # its members alone may fit: written from its elements
        subs = {k: g.reports[k] for k in c.children if k in g.reports}
        chosen = reports_only(subs, {k: len(g.communities[k].entity_ids) for k in subs}, tok,
                              budget)
        if chosen is None:
            continue
        out.add(c.id)
        assert c.fingerprint == reports_only_fingerprint(
            c.level, (r.fingerprint for r in subs.values())), c.id
        assert g.reports[c.id].used_subreports == tuple(r.community_id for r in chosen)
        assert g.community_rows[c.id].gate.acl == frozenset(
            a for k in c.children for a in g.community_rows[k].gate.acl)
    return out


def test_large_communities_are_written_from_child_reports_without_reading_their_elements(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A community whose elements cannot fit the report budget, and whose children's reports
    overflow it too, is written from those reports alone: an update below it reads its
    children's reports, never its relationships, and leaves the same invariants as a fresh
    build of the same state."""
    from canopy.store.reads import GraphReads

    docs = tmp_path / "docs"
    docs.mkdir()
    articles = news_articles(200, 60)
    for i, (title, body) in enumerate(articles):
        (docs / f"{i:02}.md").write_text(f"# {title}\n\n{body}", encoding="utf-8")
    budget = {"reports": {"max_context_tokens": 500}}  # the smallest budget settings allow
    ws = open_workspace(docs, index_dir=tmp_path / "index", **budget)
    build_index(ws)
    before = graph_of(ws.index_dir)
    large = _written_from_reports_alone(before, 500)
    assert large, "the corpus must hold communities written from their children's reports"

    read: set[str] = set()  # communities whose relationships were read
    real = GraphReads.relationships_among

    def spy(self: GraphReads, ids: Any) -> Any:
        ids = list(ids)
        read.update(ids)
        return real(self, ids)

    monkeypatch.setattr(GraphReads, "relationships_among", spy)
    # edit an article under a large community, and delete another
    member = sorted(before.communities[sorted(large)[0]].entity_ids)[0]
    unit = before.entities[member].text_unit_ids[0]
    edited = docs / before.documents[before.units[unit].document_id].path
    edited.write_text(edited.read_text(encoding="utf-8")
                      + "\n\nAnalysts expected the deal to close next quarter.\n",
                      encoding="utf-8")
    (docs / "59.md").unlink()
    build_index(ws)
    after = graph_of(ws.index_dir)
    large_after = _written_from_reports_alone(after, 500)
    changed = {cid for cid in large_after
               if before.communities.get(cid) is None
               or before.communities[cid].fingerprint != after.communities[cid].fingerprint}
    assert changed, "the update must reach a community written from its children's reports"
    assert not changed & read
    assert_community_invariants(ws.index_dir)
    monkeypatch.undo()
    fresh = open_workspace(docs, index_dir=tmp_path / "fresh", **budget)
    build_index(fresh)
    assert canonical(ws.index_dir) == canonical(fresh.index_dir)
    assert _written_from_reports_alone(graph_of(fresh.index_dir), 500)

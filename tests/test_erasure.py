"""A deleted document's text leaves the disk (issue "Safety", case 10).

Once a document is deleted and the index updated, no byte of the index folder - the SQLite
file, its WAL, the search tables with all their versions - still holds its text: not the
text units, not the LLM responses cached for its extraction, summaries and reports, not an
answer cached at query time, not an old search-table version (canopy.store.sources,
`secure_delete`, `VectorStore.tidy`).

The index is built with the fake OpenAI-compatible endpoint, so the response cache is written
as with a real one; old search-table versions are kept 0 s (`keep_versions_s = 0`), so the
bound that applies in production (the first index run `keep_versions_s` after the deletion)
is reached at once.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from canopy.server import engines
from canopy.server.runtime import Workspace, build_index, open_workspace
from canopy.server.service import CanopyService
from tests.conftest import EXAMPLES
from tests.fakes.openai_server import FakeOpenAI

SECRET = "Marrowby Fen"
SENTENCE = ("Odalys Quennell of Marrowby Fen Holdings hid eleven brass astrolabes under the old "
            "tide mill at Skelwick.")
DOCUMENT = f"""# Marrowby Fen Holdings

{SENTENCE} Odalys Quennell reports to Tobias Ferrant, who runs Marrowby Fen Holdings from
Skelwick. Marrowby Fen Holdings supplies Helio Cells Ltd with brass fittings.
"""


def holders(index_dir: Path, needle: str) -> list[str]:
    """Files of the index folder whose bytes contain `needle` (UTF-8)."""
    data = needle.encode("utf-8")
    return sorted(str(p.relative_to(index_dir)) for p in index_dir.rglob("*")
                  if p.is_file() and data in p.read_bytes())


def workspace(docs: Path, index_dir: Path, fake: FakeOpenAI) -> Workspace:
    return open_workspace(docs, index_dir=index_dir,
                          llm={"base_url": fake.base_url, "max_retries": 1, "backoff_s": 0.01},
                          storage={"keep_versions_s": 0})


def ask(ws: Workspace, question: str) -> str:
    """A basic search through the service, whose answer the response cache keeps."""
    service = CanopyService(ws)
    try:
        with service.context(None) as ctx:
            return asyncio.run(engines.basic_search(ctx, question)).answer
    finally:
        service.close()


def derived_keys(index_dir: Path, needle: str) -> set[str]:
    """Keys of cached responses, views and embeddings derived from units containing `needle`."""
    db = sqlite3.connect(index_dir / "canopy.sqlite")
    try:
        return {r[0] for r in db.execute(
            "SELECT key FROM cache_sources WHERE unit_id IN "
            "(SELECT id FROM text_units WHERE text LIKE ?)", (f"%{needle}%",))}
    finally:
        db.close()


def still_cached(index_dir: Path, keys: set[str]) -> int:
    db = sqlite3.connect(index_dir / "canopy.sqlite")
    try:
        return sum(db.execute(f"SELECT COUNT(*) FROM {table} WHERE key IN "  # noqa: S608
                              "(SELECT value FROM json_each(?))", (json.dumps(sorted(keys)),))
                   .fetchone()[0] for table in ("llm_cache", "embeddings", "acl_views"))
    finally:
        db.close()


def cached(index_dir: Path, needle: str) -> int:
    db = sqlite3.connect(index_dir / "canopy.sqlite")
    try:
        return int(db.execute("SELECT COUNT(*) FROM llm_cache WHERE response LIKE ? OR key IN "
                              "(SELECT key FROM cache_sources WHERE unit_id IN "
                              "(SELECT id FROM text_units WHERE text LIKE ?))",
                              (f"%{needle}%", f"%{needle}%")).fetchone()[0])
    finally:
        db.close()


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    for name in ("suppliers", "projects"):
        shutil.copytree(EXAMPLES / name, tmp_path / "docs" / name)
    return tmp_path / "docs"


def test_a_deleted_documents_text_is_nowhere_in_the_index_folder(
    docs: Path, tmp_path: Path
) -> None:
    index_dir = tmp_path / "index"
    with FakeOpenAI() as fake:
        ws = workspace(docs, index_dir, fake)
        build_index(ws)
        (docs / "marrowby.md").write_text(DOCUMENT, encoding="utf-8")
        build_index(ws)
        answer = ask(ws, "Who hid the brass astrolabes at Skelwick?")
        # The text is everywhere a deletion has to reach: units, the LLM cache (extraction,
        # summaries, reports, the answer just given), the search tables.
        assert SECRET in answer
        assert cached(index_dir, SECRET) >= 3
        assert any(h.startswith("lance/") for h in holders(index_dir, SENTENCE))
        assert fake.count("extract") and fake.count("report")
        derived = derived_keys(index_dir, SECRET)
        before = still_cached(index_dir, derived)
        assert before >= 5  # extraction, summaries, reports, embeddings

        (docs / "marrowby.md").unlink()
        result = build_index(ws)
        assert result.stats["documents"] == 6

    assert holders(index_dir, SENTENCE) == []
    assert holders(index_dir, SECRET) == []
    # Gone, except texts the regeneration wrote again, identical, from the remaining units
    # (recorded under those alone: checked below).
    assert still_cached(index_dir, derived) < before / 4
    db = sqlite3.connect(index_dir / "canopy.sqlite")
    try:
        assert db.execute("SELECT COUNT(*) FROM llm_cache").fetchone()[0] > 0  # the rest stays
        live = db.execute("SELECT COUNT(*) FROM cache_sources WHERE unit_id != '' AND unit_id "
                          "NOT IN (SELECT id FROM text_units)").fetchone()[0]
        assert live == 0
    finally:
        db.close()


def test_an_edited_paragraphs_old_text_leaves_the_index_folder(docs: Path, tmp_path: Path) -> None:
    """A unit replaced by an edit is removed at the commit of the update, with its cache."""
    index_dir = tmp_path / "index"
    target = docs / "suppliers" / "helio_cells.md"
    original = target.read_text(encoding="utf-8")
    with FakeOpenAI() as fake:
        ws = workspace(docs, index_dir, fake)
        target.write_text(f"{original}\n\n{SENTENCE}\n", encoding="utf-8")
        build_index(ws)
        assert holders(index_dir, SENTENCE)
        target.write_text(f"{original}\n\nThe mill at Skelwick was sold in 2024.\n",
                          encoding="utf-8")
        build_index(ws)
    assert holders(index_dir, SENTENCE) == []


def test_no_search_table_keeps_deleted_rows_in_its_files(tmp_path: Path) -> None:
    """Lance marks deleted rows and keeps them in their data file until the file is rewritten
    (compaction does so only past 10% of a file's rows): the tidy after the update rewrites
    such tables, then prunes the versions that held them. Shown on Lance's own accounting,
    because large data files are compressed and a byte search would not see their text."""
    import lancedb

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    ws = open_workspace(docs, index_dir=tmp_path / "index", storage={"keep_versions_s": 0})
    build_index(ws)
    (docs / "suppliers" / "bluewater_logistics.txt").unlink()  # one unit of 18
    build_index(ws)
    db = lancedb.connect(str(tmp_path / "index" / "lance"))
    for name in ("text_units", "entities", "reports"):
        versions = db.open_table(name).list_versions()
        assert len(versions) <= 2, name  # the rest were pruned
        assert versions[-1]["metadata"]["total_deletion_file_rows"] == "0", name
    # Nothing left to prune: a run with nothing to do leaves the tables alone.
    manifests = sorted((tmp_path / "index" / "lance").rglob("*.manifest"))
    assert build_index(ws).stats.get("noop") is True
    assert sorted((tmp_path / "index" / "lance").rglob("*.manifest")) == manifests


def test_versions_committed_within_the_grace_period_are_kept_for_readers() -> None:
    """`floor`: every version committed during the last keep seconds stays (a request holds the
    versions it started with); older history is forgotten."""
    from canopy.vectors import floor, superseded

    history = superseded(None, {"text_units": 3, "entities": 5}, now=1000.0)
    history = superseded(history, {"text_units": 7, "entities": 9}, now=1500.0)
    current = {"text_units": 12, "entities": 14}
    assert floor(history, current, now=1550.0, keep=600)[0] == {"text_units": 3, "entities": 5}
    kept, rest = floor(history, current, now=1700.0, keep=600)
    assert kept == {"text_units": 7, "entities": 9}  # the first was superseded 700 s ago
    assert json.loads(rest) == [[1500.0, {"text_units": 7, "entities": 9}]]
    assert floor(history, current, now=2200.0, keep=600)[0] == current


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_deleted_documents_claims_go_with_its_text_and_status_counts_a_clean_build(
        docs: Path, tmp_path: Path, interrupted: bool) -> None:
    """Issue 30, finding 3: the regeneration after a deletion rewrote the claims of edited
    documents only, so a deleted document's claims stayed in the database with their text,
    counted by `canopy status` (136 against 128 in a clean build). `interrupted`: the update
    stops after its revocation commit (reports fail) and the next run finishes it: the units
    that revocation deleted are remembered, so their claims and extraction instances go then."""
    from canopy.errors import EndpointUnavailable
    from canopy.indexer.pipeline import run_index
    from canopy.providers import make_embedder
    from canopy.providers.builtin import BuiltinProvider
    from canopy.server.status import index_status

    class ReportsDown(BuiltinProvider):
        async def report(self, context, *, max_tokens):  # type: ignore[no-untyped-def]
            raise EndpointUnavailable("LLM endpoint down (test)")

    claim = "Helio Cells Ltd sued Odalys Quennell of Marrowby Fen Holdings on 3 March 2025."
    (docs / "marrowby.md").write_text(DOCUMENT + "\n" + claim + "\n", encoding="utf-8")
    settings = {"extract": {"claims": True}, "storage": {"keep_versions_s": 0}}
    ws = open_workspace(docs, index_dir=tmp_path / "index", **settings)
    build_index(ws)
    db = sqlite3.connect(ws.index_dir / "canopy.sqlite")
    try:
        assert db.execute("SELECT COUNT(*) FROM claims WHERE quote LIKE ?",
                          (f"%{SECRET}%",)).fetchone()[0] > 0
    finally:
        db.close()
    (docs / "marrowby.md").unlink()
    if interrupted:
        store = ws.store()
        try:
            with pytest.raises(EndpointUnavailable):
                asyncio.run(run_index(docs, store, ws.settings, ReportsDown(),
                                      make_embedder(ws.settings), labeler=ws.policy.labels_for))
        finally:
            store.close()
    build_index(ws)
    clean = open_workspace(docs, index_dir=tmp_path / "clean", **settings)
    build_index(clean)

    def counts(w: Workspace) -> dict[str, int]:  # what `canopy status` prints
        store = w.store()
        try:
            s = index_status(store)
        finally:
            store.close()
        return {k: getattr(s, k) for k in ("documents", "text_units", "entities",
                                           "relationships", "claims")}

    assert counts(ws) == counts(clean) and counts(clean)["claims"] > 0
    assert holders(ws.index_dir, SECRET) == []


def test_an_index_written_before_the_fix_loses_its_deleted_claims_when_opened(
        docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration m010: an index whose deletion ran before issue 30's fix (the regeneration
    re-merged the claims of the changed units only, not those of the deleted document's) holds
    those claims; the first open by this release deletes them, and `canopy status` counts what
    a clean build does."""
    import canopy.indexer.pipeline as pipeline
    from canopy.server.status import index_status
    from canopy.store import Store

    claim = "Helio Cells Ltd sued Odalys Quennell of Marrowby Fen Holdings on 3 March 2025."
    (docs / "marrowby.md").write_text(DOCUMENT + "\n" + claim + "\n", encoding="utf-8")
    settings = {"extract": {"claims": True}}
    ws = open_workspace(docs, index_dir=tmp_path / "index", **settings)
    build_index(ws)
    db = sqlite3.connect(ws.index_dir / "canopy.sqlite")
    try:
        gone = {u for (u,) in db.execute("SELECT u.id FROM text_units u JOIN documents d ON "
                                         "d.id = u.document_id WHERE d.path = 'marrowby.md'")}
    finally:
        db.close()
    (docs / "marrowby.md").unlink()
    real = pipeline.stage_graph

    async def as_before(b, changed, **rekeyed):  # type: ignore[no-untyped-def]
        return await real(b, [u for u in changed if u not in gone], **rekeyed)

    with monkeypatch.context() as m:  # the deletion as the release before the fix ran it
        m.setattr(pipeline, "stage_graph", as_before)
        build_index(ws)

    def orphans() -> int:
        db = sqlite3.connect(ws.index_dir / "canopy.sqlite")
        try:
            return int(db.execute("SELECT COUNT(*) FROM claims WHERE unit_id NOT IN "
                                  "(SELECT id FROM text_units)").fetchone()[0])
        finally:
            db.close()

    assert orphans() > 0  # what the bug left
    db = sqlite3.connect(ws.index_dir / "canopy.sqlite")
    try:
        with db:
            db.execute("DELETE FROM _migrations WHERE name = 'm010_orphan_claims'")
    finally:
        db.close()
    store = Store(ws.index_dir)
    try:
        migrated = index_status(store).claims
    finally:
        store.close()
    assert orphans() == 0
    clean = open_workspace(docs, index_dir=tmp_path / "clean", **settings)
    build_index(clean)
    store = clean.store()
    try:
        assert migrated == index_status(store).claims > 0
    finally:
        store.close()

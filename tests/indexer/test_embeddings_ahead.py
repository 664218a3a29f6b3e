"""Embeddings requested while the chat stages run (issue 35): an endpoint's embedding requests
start during extraction, not after the last report, and the index holds the same search rows
as one built with every embedding requested at the end."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from canopy.errors import ProviderError
from canopy.indexer import pipeline
from canopy.providers.embed import OpenAIEmbedder
from canopy.server.runtime import build_index, open_workspace
from tests.conftest import EXAMPLES
from tests.fakes.openai_server import FakeOpenAI


def _build(tmp_path: Path, fake: FakeOpenAI, name: str) -> tuple[Path, dict]:
    docs = tmp_path / "docs"
    if not docs.exists():
        shutil.copytree(EXAMPLES / "suppliers", docs)
    index = tmp_path / name
    ws = open_workspace(docs, index_dir=index,
                        llm={"base_url": fake.base_url, "model": "fake", "max_retries": 1},
                        embed={"base_url": fake.base_url, "model": "fake-embed"})
    result = build_index(ws)
    assert result.stats["units_failed"] == 0
    return index, result.stats


def _rows(index: Path) -> list[tuple[str, bytes]]:
    """The index's embedding cache: each text's key and its vector."""
    db = sqlite3.connect(index / "canopy.sqlite")
    try:
        return sorted(db.execute("SELECT key, vector FROM embeddings").fetchall())
    finally:
        db.close()


def test_unit_embeddings_are_requested_while_extraction_runs(tmp_path: Path) -> None:
    with FakeOpenAI(latency=0.02) as fake:
        _, stats = _build(tmp_path, fake, "idx")
        requests = list(fake.requests)
    chat = [r for r in requests if r.path.endswith("/chat/completions")]
    embeds = [r for r in requests if r.path.endswith("/embeddings")]
    last_extraction = max(r.time for r in chat if r.task in ("extract", "glean"))
    assert embeds and min(r.time for r in embeds) < last_extraction
    # every text was sent once: the vectors stage found the early ones cached
    sent = sum(len(r.body["input"]) for r in embeds)
    assert sent == stats["embedded"]


def test_the_search_rows_are_those_of_a_build_that_embeds_at_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeOpenAI() as fake:
        early, _ = _build(tmp_path, fake, "early")
        monkeypatch.setattr(pipeline, "embeds_remotely", lambda embedder: False)
        late, _ = _build(tmp_path, fake, "late")
    assert _rows(early) == _rows(late)


def test_a_failed_early_request_is_asked_again_by_the_vectors_stage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first embedding calls, the ones made ahead during extraction, fail: the build still
    completes, and its embeddings are those of a build where nothing failed."""
    real = OpenAIEmbedder.embed
    failed: list[int] = []

    async def failing_first(self: OpenAIEmbedder, texts: list[str]) -> np.ndarray:
        if len(failed) < 2:
            failed.append(len(texts))
            raise ProviderError("refused (the test's)")
        return await real(self, texts)

    with FakeOpenAI() as fake:
        clean, _ = _build(tmp_path, fake, "clean")
        monkeypatch.setattr(OpenAIEmbedder, "embed", failing_first)
        index, stats = _build(tmp_path, fake, "idx")
    assert len(failed) == 2 and stats["embedded"] > 0
    assert _rows(index) == _rows(clean)

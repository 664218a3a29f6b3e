"""What a full build would cost, measured on a sample before paying for the corpus.

The GraphRAG literature's first warning is that indexing cost is hard to guess: it depends on
the corpus, the model's verbosity and the graph it finds. So the estimate runs the real
pipeline - the configured endpoint, prompts, gleaning, summaries, clustering and reports - on a
sample of the corpus's own text units (chosen by a hash of their ids, so spread over the
documents and the same each time), in a throwaway index, and scales each task's calls and
tokens by the ratio of units. Extraction and gleaning scale with units exactly; summaries and
reports depend on how entities recur across the corpus, which a sample sees less of, so they
are the rough part (`benchmarks/estimate_bench.py` measures the error against real builds).

With no endpoint configured the builtin provider makes no calls and costs nothing; the estimate
then says so and gives the corpus's size only.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from canopy.providers import make_embedder, make_provider
from canopy.store import Store
from canopy.tokens import get_tokenizer
from indexer.chunking import chunk_document
from indexer.loaders import LoadedDocument, scan_folder
from indexer.pipeline import run_index
from server.runtime import Workspace

__all__ = ["BuildEstimate", "TaskEstimate", "estimate_build"]


class TaskEstimate(BaseModel):
    task: str
    sample_calls: int
    sample_prompt_tokens: int
    sample_completion_tokens: int
    calls: int = Field(description="Expected for the whole corpus")
    prompt_tokens: int
    completion_tokens: int
    cost: float | None = None


class BuildEstimate(BaseModel):
    documents: int
    units: int
    unit_tokens: int
    sample_units: int
    provider: str
    tasks: list[TaskEstimate]
    sample_wall_s: float
    wall_s: float = Field(description="Expected full-build wall time at the sample's pace")
    price_input_per_mtok: float | None = None
    price_output_per_mtok: float | None = None

    @property
    def calls(self) -> int:
        return sum(t.calls for t in self.tasks)

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.tasks)

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.tasks)

    @property
    def cost(self) -> float | None:
        costs = [t.cost for t in self.tasks]
        return None if not costs or any(c is None for c in costs) else sum(c or 0 for c in costs)


def _spread(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def estimate_build(ws: Workspace, *, sample: int = 40, price_in: float | None = None,
                   price_out: float | None = None) -> BuildEstimate:
    """Chunk the whole corpus, build `sample` of its units for real in a temporary index, and
    scale each task's usage to the corpus. `price_in`/`price_out`: currency per million prompt
    and completion tokens (None: no cost is computed)."""
    settings = ws.settings
    tok = get_tokenizer(settings.chunking.encoding)
    docs = [d for d in scan_folder(ws.docs_dir, settings.input, ws.index_dir)
            if isinstance(d, LoadedDocument)]
    units = [u for d in docs for u in chunk_document(
        d.path, d.text, tok, max_tokens=settings.chunking.chunk_tokens,
        overlap=settings.chunking.overlap_tokens)]
    chosen = sorted(units, key=lambda u: _spread(u.id))[:max(1, sample)]
    if not settings.llm.enabled or not chosen:
        return BuildEstimate(documents=len(docs), units=len(units),
                             unit_tokens=sum(u.n_tokens for u in units),
                             sample_units=0, provider="builtin", tasks=[], sample_wall_s=0.0,
                             wall_s=0.0)
    work = Path(tempfile.mkdtemp(prefix="canopy-estimate-"))
    try:
        sample_docs = work / "docs"
        sample_docs.mkdir()
        for i, unit in enumerate(chosen):
            (sample_docs / f"unit-{i:05d}.txt").write_text(unit.text, encoding="utf-8")
        store = Store(work / "index")
        try:
            began = time.perf_counter()
            result = asyncio.run(run_index(sample_docs, store, settings,
                                           make_provider(settings, store),
                                           make_embedder(settings)))
            took = time.perf_counter() - began
        finally:
            store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    built = max(1, int(result.stats.get("text_units", len(chosen))))
    scale = len(units) / built
    tasks = []
    for task, usage in sorted(result.usage.items()):
        calls, p, c = (int(usage.get(k, 0)) for k in ("calls", "prompt_tokens",
                                                      "completion_tokens"))
        est_p, est_c = round(p * scale), round(c * scale)
        cost = (None if price_in is None or price_out is None
                else (est_p * price_in + est_c * price_out) / 1e6)
        tasks.append(TaskEstimate(task=task, sample_calls=calls, sample_prompt_tokens=p,
                                  sample_completion_tokens=c, calls=round(calls * scale),
                                  prompt_tokens=est_p, completion_tokens=est_c, cost=cost))
    return BuildEstimate(documents=len(docs), units=len(units),
                         unit_tokens=sum(u.n_tokens for u in units), sample_units=built,
                         provider=f"openai-compatible {settings.llm.model}", tasks=tasks,
                         sample_wall_s=round(took, 2), wall_s=round(took * scale, 1),
                         price_input_per_mtok=price_in, price_output_per_mtok=price_out)

"""What a full build would cost, measured on a sample before paying for the corpus.

The GraphRAG literature's first warning is that indexing cost is hard to guess: it depends on
the corpus, the model's verbosity and the graph it finds. So the estimate runs the real
pipeline - the configured endpoint, prompts, gleaning, summaries, clustering and reports - on
samples of the corpus's own text units (chosen by a hash of their ids, so spread over the
documents and the same each time), in throwaway indexes, and scales each task to the corpus:
- extraction and gleaning are one call (and one more per gleaning) per unit: calls scale with
  units, tokens with the units' tokens;
- summaries and reports depend on how entities recur across documents, which a small sample
  sees less of: they are measured on two samples, half and whole, and extrapolated along the
  growth between the two (a power law in tokens, exponent between 0.5 and 2).
`benchmarks/estimate_bench.py` measures the error against real builds.

With no endpoint configured the builtin provider makes no calls and costs nothing; the estimate
then says so and gives the corpus's size only.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from canopy.indexer.forecast import extrapolate
from canopy.indexer.pipeline import run_index
from canopy.model import TextUnit
from canopy.providers import make_embedder, make_provider
from canopy.server.runtime import Workspace
from canopy.server.sampling import corpus_units, spread_sample
from canopy.store import Store

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
    spent_calls: int = Field(0, description="Calls the two sample builds really made")
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


def estimate_build(ws: Workspace, *, sample: int = 40, price_in: float | None = None,
                   price_out: float | None = None) -> BuildEstimate:
    """Chunk the whole corpus, build `sample` of its units for real in a temporary index, and
    scale each task's usage to the corpus. `price_in`/`price_out`: currency per million prompt
    and completion tokens (None: no cost is computed)."""
    settings = ws.settings
    docs, units = corpus_units(ws)
    chosen = spread_sample(units, sample)
    total_tokens = sum(u.n_tokens for u in units)
    if not settings.llm.enabled or not chosen:
        return BuildEstimate(documents=len(docs), units=len(units), unit_tokens=total_tokens,
                             sample_units=0, provider="builtin", tasks=[], sample_wall_s=0.0,
                             wall_s=0.0)
    half = chosen[:max(1, len(chosen) // 2)]
    small, _, _ = _sample_build(ws, half)
    usage, built_units, took = _sample_build(ws, chosen)
    tok_small = sum(u.n_tokens for u in half)
    tok_sample = sum(u.n_tokens for u in chosen)
    unit_scale = len(units) / max(1, built_units)
    token_scale = total_tokens / max(1, tok_sample)
    tasks = []
    for task, used in sorted(usage.items()):
        sample_q = {k: int(used.get(k, 0)) for k in _QUANTITIES}
        if task in _PER_UNIT:
            est = {"calls": sample_q["calls"] * unit_scale,
                   "prompt_tokens": sample_q["prompt_tokens"] * token_scale,
                   "completion_tokens": sample_q["completion_tokens"] * token_scale}
        else:
            est = {k: extrapolate(int(small.get(task, {}).get(k, 0)), tok_small, v,
                                   tok_sample, total_tokens) for k, v in sample_q.items()}
        est_p, est_c = round(est["prompt_tokens"]), round(est["completion_tokens"])
        cost = (None if price_in is None or price_out is None
                else (est_p * price_in + est_c * price_out) / 1e6)
        tasks.append(TaskEstimate(task=task, sample_calls=sample_q["calls"],
                                  sample_prompt_tokens=sample_q["prompt_tokens"],
                                  sample_completion_tokens=sample_q["completion_tokens"],
                                  calls=round(est["calls"]), prompt_tokens=est_p,
                                  completion_tokens=est_c, cost=cost))
    return BuildEstimate(documents=len(docs), units=len(units), unit_tokens=total_tokens,
                         sample_units=built_units, provider=f"openai-compatible "
                         f"{settings.llm.model}", tasks=tasks, sample_wall_s=round(took, 2),
                         spent_calls=sum(int(u.get("calls", 0)) for run in (small, usage)
                                         for u in run.values()),
                         wall_s=round(took * token_scale, 1), price_input_per_mtok=price_in,
                         price_output_per_mtok=price_out)


_QUANTITIES = ("calls", "prompt_tokens", "completion_tokens")
# one call per unit and gleaning pass, and at most one confirmation of its names' open pairs
# (LLMProvider.extract)
_PER_UNIT = {"extract", "glean", "resolve"}


def _sample_build(ws: Workspace, units: list[TextUnit]
                  ) -> tuple[dict[str, dict[str, int]], int, float]:
    """Usage by task, units built and wall time of a build of these units alone (one document
    each) in a throwaway index, with the workspace's settings and endpoint."""
    # Each sampled unit is one document, chunked as one unit whole (with the overlap it
    # repeats from the unit before it in the corpus): the prompts see what the build's would.
    chunking = ws.settings.chunking
    settings = ws.settings.model_copy(update={"chunking": chunking.model_copy(update={
        "chunk_tokens": chunking.chunk_tokens + chunking.overlap_tokens + 64,
        "overlap_tokens": 0})})
    work = Path(tempfile.mkdtemp(prefix="canopy-estimate-"))
    try:
        sample_docs = work / "docs"
        sample_docs.mkdir()
        for i, unit in enumerate(units):
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
    return result.usage, int(result.stats.get("text_units", len(units))), took

"""The builtin provider's CPU work in worker processes, for a large build on a local machine:
extraction, the merged elements' summaries, and the hashing embedder's vectors.

With no endpoint a build is CPU-bound, and the writer is one Python process: the builtin
extractor (tens of milliseconds a text unit) then holds one core while the others idle. Worker
processes extract batches of units side by side while the writer stores what comes back.
Every result is a pure function of its unit (the builtin extractor is deterministic), and
the extraction stage stores results by unit id, so the index is the one an in-process build
makes.

Workers are `python -c _WORKER_MAIN`, started by the writer with its `sys.path`, speaking
length-prefixed pickles over their stdin and stdout. Not
`multiprocessing`: its spawned children re-run the caller's main script (a script calling
`build_index` without a `__main__` guard would build again in every worker, and wait on the
writer lock forever), and a fork would copy LanceDB's and SQLite's threads mid-state. A
worker moves its stdout aside before it imports anything, so nothing it prints can reach the
pipe (or, in a stdio MCP server, the protocol).

The Ray wing does the same across a cluster (server/wings/ray/builtin_work.py); this is its
one-machine form.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import BinaryIO

import numpy as np

from canopy.errors import ProviderError
from canopy.ids import memoized_names
from canopy.model import Extraction, TextUnit
from canopy.providers.builtin.embedder import HashEmbedder
from canopy.providers.builtin.extraction import extract_unit

__all__ = ["AUTO_MIN_TEXTS", "AUTO_MIN_UNITS", "ProcessDescriber", "ProcessEmbedder",
           "ProcessExtractor", "WorkerDied", "WorkerPool", "cores", "describe_batch",
           "embedding_processes", "extract_batch", "extraction_processes", "summary_processes"]

# Below this many units to extract, `processes` unset keeps extraction in the writer: starting
# a worker costs about half a second (its imports), which a small update would pay for
# nothing. A full build of 200 news articles has about this many units.
AUTO_MIN_UNITS = 500
# Units a task: tens of milliseconds each, so a task is a fraction of a second, and the
# per-task cost (pickling the units and their extractions) stays small.
BATCH_UNITS = 16
# The same for the hashing embedder (about a tenth of a millisecond a text): a run that
# embeds fewer texts than this hashes them in the writer. A full build of 500 news articles
# embeds about 20,000 (units, entities, reports).
AUTO_MIN_TEXTS = 10_000
# Fewer texts than this are not worth a worker's share of an embedding call.
MIN_EMBED_TEXTS = 64
# Elements a summary task (a millisecond or so each): a task is tens of milliseconds.
BATCH_DESCRIPTIONS = 64
_HEADER = struct.Struct("!I")
# The stdout pipe is kept as another descriptor and stdout becomes stderr before anything is
# imported: whatever prints goes to stderr, never into the replies.
_WORKER_MAIN = ("import os; channel = os.dup(1); os.dup2(2, 1); "
                "from canopy.providers.builtin.processes import serve; serve(channel)")


def extract_batch(units: Sequence[TextUnit], entity_types: Sequence[str],
                  claims: bool) -> list[Extraction]:
    """`extract_unit` of each unit, in order (a worker's task; the Ray wing's too)."""
    with memoized_names():
        return [extract_unit(u, entity_types=entity_types, claims=claims) for u in units]


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _processes(setting: int | None, work: int, least: int) -> int:
    """Worker processes for `work` items (0: none, the work stays in the writer): `setting`
    when given (1: none), else one per core for at least `least` items on a machine of more
    than one."""
    if not work:
        return 0
    if setting is not None:
        return setting if setting > 1 else 0
    n = cores()
    return n if n > 1 and work >= least else 0


def extraction_processes(setting: int | None, units: int) -> int:
    """Worker processes for a run that extracts `units` units."""
    return _processes(setting, units, AUTO_MIN_UNITS)


def embedding_processes(setting: int | None, texts: int) -> int:
    """Worker processes for a vectors stage that hashes `texts` texts."""
    return _processes(setting, texts, AUTO_MIN_TEXTS)


def summary_processes(setting: int | None, elements: int) -> int:
    """Worker processes for a merge of `elements` entities and relationships (a few in ten
    need a summary, a millisecond or so each: the same bound as the vectors')."""
    return _processes(setting, elements, AUTO_MIN_TEXTS)


class WorkerDied(ProviderError):
    """A worker process ended before it answered (killed, out of memory)."""


class _Worker:
    """One worker process and its pipes; one task at a time. A call's pipe traffic runs on a
    thread with blocking reads: on the event loop, a 12 MB reply (8,192 vectors) is read 256 KB
    a turn of the loop, and a writer busy with reports gives the loop a turn a few times a
    second, so a reply took seconds to arrive (`SearchRows.start_early`)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> _Worker:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        return cls(subprocess.Popen(  # noqa: S603 (this interpreter, our module)
            [sys.executable, "-c", _WORKER_MAIN],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env))

    def _call(self, data: bytes) -> tuple[bool, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(_HEADER.pack(len(data)) + data)
        self.proc.stdin.flush()
        head = self.proc.stdout.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise EOFError("the worker closed its output")
        size, = _HEADER.unpack(head)
        body = self.proc.stdout.read(size)
        if len(body) < size:
            raise EOFError("the worker closed its output mid-reply")
        reply: tuple[bool, object] = pickle.loads(body)  # noqa: S301 (our child)
        return reply

    async def call(self, payload: object) -> object:
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        ok, value = await asyncio.to_thread(self._call, data)
        if not ok:
            raise ProviderError(f"a builtin worker process failed: {value}")
        return value

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ConnectionError, OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # end of input: the worker exits
            try:
                await asyncio.to_thread(self.proc.wait, 5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class WorkerPool:
    """`workers` worker processes, started at the first task, for one run (`close` ends them;
    extraction and the vectors share them: a build starts its workers once). When every worker
    has died, tasks run in the writer."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.tasks = 0
        self._idle: asyncio.Queue[_Worker | None] | None = None
        self._all: list[_Worker] = []
        self._alive = 0
        self._starting: asyncio.Lock | None = None

    async def _queue(self) -> asyncio.Queue[_Worker | None]:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._idle is None:
                idle: asyncio.Queue[_Worker | None] = asyncio.Queue()
                for w in await asyncio.gather(*(_Worker.start() for _ in range(self.workers))):
                    self._all.append(w)
                    idle.put_nowait(w)
                self._alive = len(self._all)
                self._idle = idle
        return self._idle

    def _lost(self, idle: asyncio.Queue[_Worker | None]) -> None:
        self._alive -= 1
        if not self._alive:  # wake whoever waits for a worker: none will come back
            idle.put_nowait(None)

    async def run(self, task: str, *args: object) -> object:
        """`_TASKS[task](*args)` in a worker (in the writer once none is left). WorkerDied when
        the worker it ran in ended before answering."""
        self.tasks += 1
        idle = await self._queue()
        worker = await idle.get()
        if worker is None:
            idle.put_nowait(None)
            return _TASKS[task](*args)
        try:
            value = await worker.call((task, args))
        except (EOFError, ConnectionError) as exc:
            self._lost(idle)
            raise WorkerDied(f"a builtin worker process ended ({type(exc).__name__})") from None
        except ProviderError:
            idle.put_nowait(worker)  # the task failed, but the worker answered: it serves on
            raise
        except BaseException:
            # cancelled mid-call: the pipe may hold half a reply, so this worker is not reused
            await worker.stop()
            self._lost(idle)
            raise
        idle.put_nowait(worker)
        return value

    async def close(self) -> None:
        await asyncio.gather(*(w.stop() for w in self._all), return_exceptions=True)
        self._all = []


class ProcessExtractor:
    """A `BatchExtractor` over a pool of worker processes (the run's: its owner closes it).
    `count` is called once per unit sent, in the writer (the provider's accounting)."""

    def __init__(self, pool: WorkerPool, count: Callable[[str], None]) -> None:
        self.extract_batch_size = BATCH_UNITS
        # two batches a worker: one running, one on its way
        self.extract_batches_in_flight = 2 * pool.workers
        self.pool = pool
        self._count = count

    async def extract_batch(self, units: list[TextUnit], *, entity_types: list[str],
                            claims: bool, max_gleanings: int) -> list[Extraction]:
        for _ in units:
            self._count("extract")
        try:
            got = await self.pool.run("extract", list(units), list(entity_types), claims)
        except WorkerDied as exc:
            # its batch's units are failures, retried by the next run; the others carry on
            raise ProviderError(f"{exc}; its units are retried by the next run") from None
        assert isinstance(got, list)
        return got


class ProcessEmbedder:
    """The hashing embedder with each call's texts split over a pool of worker processes (the
    run's: its owner closes it; the same vectors: hashing is a pure function of the text). A
    worker that dies leaves its share to the writer."""

    lexical = True
    cache_vectors = False

    def __init__(self, local: HashEmbedder, pool: WorkerPool) -> None:
        self.local = local
        self.name = local.name
        self.dims = local.dims
        self.pool = pool

    async def _part(self, texts: list[str]) -> np.ndarray:
        try:
            got = await self.pool.run("embed", self.dims, self.name, texts)
        except WorkerDied:
            return self.local.embed_sync(texts)
        assert isinstance(got, np.ndarray)
        return got

    async def embed(self, texts: list[str]) -> np.ndarray:
        if len(texts) < 2 * MIN_EMBED_TEXTS:
            return self.local.embed_sync(texts)
        n = min(self.pool.workers, len(texts) // MIN_EMBED_TEXTS)
        size = -(-len(texts) // n)
        parts = await asyncio.gather(*(self._part(texts[i:i + size])
                                       for i in range(0, len(texts), size)))
        return np.vstack(parts)


class ProcessDescriber:
    """The builtin provider's summaries of merged elements over the run's worker processes
    (`canopy.indexer.descriptions.describe(batch=...)`), a task per `BATCH_DESCRIPTIONS`
    elements; `count` is called once per element, in the writer (the provider's accounting).
    A worker that dies leaves its batch to the writer."""

    def __init__(self, pool: WorkerPool, count: Callable[[str], None], encoding: str) -> None:
        self.pool = pool
        self.batch_size = BATCH_DESCRIPTIONS
        self._count = count
        self._encoding = encoding

    async def describe_batch(self, items: list[list[str]], *, max_tokens: int) -> list[str]:
        for _ in items:
            self._count("summarize")
        try:
            got = await self.pool.run("describe", self._encoding, max_tokens, items)
        except WorkerDied:
            return describe_batch(self._encoding, max_tokens, items)
        assert isinstance(got, list)
        return got


def _embed(dims: int, name: str, texts: list[str]) -> np.ndarray:
    embedder = HashEmbedder(dims)
    if embedder.name != name:  # cannot happen with one install; would give other vectors
        raise ProviderError(f"a worker's hashing embedder is {embedder.name}, the writer's {name}")
    return embedder.embed_sync(texts)


def describe_batch(encoding: str, max_tokens: int, items: Sequence[Sequence[str]]) -> list[str]:
    """The description of each element from its descriptions (those the summary input keeps:
    canopy.indexer.descriptions.describe), a worker's task, and the writer's when no worker is
    left: the builtin provider's summary of them, or them joined when it has none."""
    from canopy.providers.builtin.summaries import summarize_descriptions
    from canopy.tokenizer import get_tokenizer

    tok = get_tokenizer(encoding)
    out = []
    for kept in items:
        text = summarize_descriptions(list(kept), max_tokens, tok)
        out.append(text.strip() or " ".join(kept))
    return out


_TASKS: dict[str, Callable[..., object]] = {"extract": extract_batch, "embed": _embed,
                                            "describe": describe_batch}


def _serve(inp: BinaryIO, out: BinaryIO) -> None:
    """A worker's loop: a task in, its result out, until the writer closes its input."""
    with memoized_names():  # for the worker's lifetime: one run
        while True:
            head = inp.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return
            task, args = pickle.loads(inp.read(_HEADER.unpack(head)[0]))  # noqa: S301
            try:
                reply: tuple[bool, object] = (True, _TASKS[task](*args))
            except Exception as exc:  # noqa: BLE001 - sent back, raised in the writer
                reply = (False, f"{type(exc).__name__}: {exc}")
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            out.write(_HEADER.pack(len(data)) + data)
            out.flush()


def serve(channel: int) -> None:
    """A worker's main: tasks on stdin, replies on file descriptor `channel` (the original
    stdout, which `_WORKER_MAIN` moved aside before any import)."""
    # Ctrl-C is the writer's to handle (it stops the workers); a worker would only add noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with os.fdopen(channel, "wb") as out:
        _serve(sys.stdin.buffer, out)

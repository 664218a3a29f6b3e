"""The builtin provider's extraction in worker processes, for a large build on a local machine.

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
import sys
from collections.abc import Callable, Sequence
from typing import BinaryIO

from canopy.errors import ProviderError
from canopy.ids import memoized_names
from canopy.model import Extraction, TextUnit
from canopy.providers.builtin.extraction import extract_unit

__all__ = ["AUTO_MIN_UNITS", "ProcessExtractor", "cores", "extract_batch",
           "extraction_processes"]

# Below this many units to extract, `processes` unset keeps extraction in the writer: starting
# a worker costs about half a second (its imports), which a small update would pay for
# nothing. A full build of 200 news articles has about this many units.
AUTO_MIN_UNITS = 500
# Units a task: tens of milliseconds each, so a task is a fraction of a second, and the
# per-task cost (pickling the units and their extractions) stays small.
BATCH_UNITS = 16
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


def extraction_processes(setting: int | None, units: int) -> int:
    """Worker processes for a run that extracts `units` units (0: none, extraction stays in
    the writer): `setting` when given (1: none), else one per core for a run of at least
    AUTO_MIN_UNITS on a machine of more than one."""
    if not units:
        return 0
    if setting is not None:
        return setting if setting > 1 else 0
    n = cores()
    return n if n > 1 and units >= AUTO_MIN_UNITS else 0


class _Worker:
    """One worker process and its pipes; one task at a time."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> _Worker:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WORKER_MAIN,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)
        return cls(proc)

    async def call(self, payload: object) -> object:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(_HEADER.pack(len(data)) + data)
        await self.proc.stdin.drain()
        size, = _HEADER.unpack(await self.proc.stdout.readexactly(_HEADER.size))
        ok, value = pickle.loads(await self.proc.stdout.readexactly(size))  # noqa: S301 (our child)
        if not ok:
            raise ProviderError(f"an extraction worker failed: {value}")
        return value

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, ConnectionError, OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # end of input: the worker exits
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()


class ProcessExtractor:
    """A `BatchExtractor` over `workers` worker processes, for one run (`close` ends them).
    `count` is called once per unit sent, in the writer (the provider's accounting)."""

    def __init__(self, workers: int, count: Callable[[str], None]) -> None:
        self.extract_batch_size = BATCH_UNITS
        # two batches a worker: one running, one on its way
        self.extract_batches_in_flight = 2 * workers
        self.workers = workers
        self._count = count
        self._idle: asyncio.Queue[_Worker] | None = None
        self._all: list[_Worker] = []
        self._starting: asyncio.Lock | None = None
        self.tasks = 0

    async def _pool(self) -> asyncio.Queue[_Worker]:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._idle is None:
                idle: asyncio.Queue[_Worker] = asyncio.Queue()
                for w in await asyncio.gather(*(_Worker.start() for _ in range(self.workers))):
                    self._all.append(w)
                    idle.put_nowait(w)
                self._idle = idle
        return self._idle

    async def extract_batch(self, units: list[TextUnit], *, entity_types: list[str],
                            claims: bool, max_gleanings: int) -> list[Extraction]:
        for _ in units:
            self._count("extract")
        self.tasks += 1
        idle = await self._pool()
        worker = await idle.get()
        try:
            got = await worker.call((list(units), list(entity_types), claims))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            # A worker that died (killed, out of memory): its batch's units are failures,
            # retried by the next run; the others carry on.
            raise ProviderError(f"an extraction worker process ended ({type(exc).__name__}); "
                                "its units are retried by the next run") from None
        except BaseException:
            # cancelled mid-call: the pipe may hold half a reply, so this worker is not reused
            await worker.stop()
            raise
        idle.put_nowait(worker)
        assert isinstance(got, list)
        return got

    async def close(self) -> None:
        await asyncio.gather(*(w.stop() for w in self._all), return_exceptions=True)
        self._all = []


def _serve(inp: BinaryIO, out: BinaryIO) -> None:
    """A worker's loop: a task in, its extractions out, until the writer closes its input."""
    with memoized_names():  # for the worker's lifetime: one run's extraction
        while True:
            head = inp.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return
            units, entity_types, claims = pickle.loads(inp.read(_HEADER.unpack(head)[0]))  # noqa: S301
            try:
                reply: tuple[bool, object] = (True, extract_batch(units, entity_types, claims))
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

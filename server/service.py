"""`CanopyService`: one opened index, shared by the MCP server and the CLI query command.

It owns the store, the search tables, the provider and embedder, the view cache and the policy,
and opens a `QueryContext` per call: a caller-scoped reader (canopy.acl.reader) over one snapshot of
the committed generation, for the principal the transport identified. Nothing is loaded up front:
the first answer reads what it needs and no more.

Engine calls run on event loops of the service's own threads (`run`, `_CallLoops`), never on
the server's: CPU-bound retrieval never blocks the protocol. Each call is a task on one of those
loops, beside the others there, with a snapshot and search-table reader of its own; while one
call awaits a search (LanceDB's asynchronous API) or an LLM endpoint, another's Python runs. One
thread running several calls this way costs less CPU per call under load than several threads
taking turns on the GIL, each call thread waiting on its own queries (benchmarks/README.md, "16
clients at 10,000 articles"). Global and DRIFT search run on a loop of their own ("long" lane): with
the builtin provider they are seconds of Python between awaits, which would hold every quick call
queued behind them. `canopy serve --http --workers N` runs N processes, which share QUICK_LOOPS.

Policy: principals -> labels and the path rules live in canopy.toml; the indexer stamps each
document with the labels the rules give it. The service re-reads the `[acl]` section whenever
the file changes or the generation moves on:
- who holds which labels applies at the next request, even when rules changed too (a revocation
  never waits for a re-index);
- which labels documents carry applies when the index update that relabels them commits;
- a file that cannot be read or parsed fails closed: every call is refused with a message
  saying so, until it is fixed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import ValidationError

from canopy.acl.caller import caller_for
from canopy.acl.policy import Policy, Principal
from canopy.acl.reader import CallerReader, ViewSupport
from canopy.acl.view_cache import ViewCache
from canopy.acl.views import ViewParams
from canopy.allocator import Trimmer, relax_collector, release_free
from canopy.errors import ConfigError, IndexDamaged, IndexMissing
from canopy.health import check_search_files
from canopy.providers import make_embedder, make_provider
from canopy.providers.base import Provider
from canopy.providers.builtin.text import load_jieba
from canopy.server.context import EngineCaches, ProgressCallback, QueryContext
from canopy.server.runtime import Workspace
from canopy.settings import AclSettings, find_config, load_settings
from canopy.store.store import damage_as_index_damaged
from canopy.tokenizer import preload
from canopy.vectors import VectorStore

# the last two: canopy.server.context
__all__ = ["CanopyService", "Lane", "ProgressCallback", "QueryContext", "lane_for"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# A settings file that cannot be read or parsed (TOMLDecodeError is a ValueError).
_UNREADABLE = (ConfigError, OSError, ValueError, ValidationError)


class _CallLoops:
    """Event loops, each on a thread of its own for the service's lifetime (so LLM connection
    pools are reused across calls). A call runs on the loop with the fewest calls in flight, as a
    task beside the others there: while one awaits a search or an LLM endpoint, the others'
    Python runs. At most `per_loop` calls run on a loop at once; more wait their turn."""

    def __init__(self, loops: int, per_loop: int, name: str) -> None:
        self._size, self._per_loop, self._name = loops, per_loop, name
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._slots: list[asyncio.Semaphore] = []
        self._inflight: list[int] = []
        self._lock = threading.Lock()
        self._closed = False

    def _start(self) -> None:
        """Start the loops' threads (at the first call: a one-off query never starts them)."""
        for i in range(self._size):
            loop = asyncio.new_event_loop()
            threading.Thread(target=_serve, args=(loop,), daemon=True,
                             name=f"{self._name}_{i}").start()
            self._loops.append(loop)
            self._slots.append(asyncio.Semaphore(self._per_loop))  # used on that loop only
            self._inflight.append(0)

    async def run(self, coro_fn: Callable[[], Awaitable[T]]) -> T:
        with self._lock:
            if self._closed:
                raise RuntimeError("the service is closed")
            if not self._loops:
                self._start()
            i = min(range(len(self._loops)), key=self._inflight.__getitem__)
            self._inflight[i] += 1
        slots = self._slots[i]

        async def call() -> T:
            async with slots:
                return await coro_fn()

        try:
            return await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(call(), self._loops[i]))
        finally:
            with self._lock:
                self._inflight[i] -= 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for loop in self._loops:
                loop.call_soon_threadsafe(_cancel_and_stop, loop)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        try:
            # Finalise parked async generators, as asyncio.run does: canopy.llm.PerLoop closes
            # each loop's HTTP session there (closed without it, aiohttp's were reported as
            # "Unclosed client session" at exit).
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def _cancel_and_stop(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.call_soon(loop.stop)  # after the cancelled tasks have run their cleanup once


# What a call may be, for the loop it runs on: "long" calls (global and DRIFT search, and the
# router that may choose them) run many model calls over many reports, seconds of CPU with the
# builtin provider; they get loops of their own, so that a quick call is never queued behind one.
Lane = Literal["quick", "long"]
_LONG_TOOLS = frozenset({"search", "global_search", "drift_search"})


def lane_for(tool: str) -> Lane:
    """The lane the tool named `tool` runs on."""
    return "long" if tool in _LONG_TOOLS else "quick"


# Event loops for quick calls per server, shared by its processes (each process has
# QUICK_LOOPS // processes, at least one), and calls in flight per loop. At 10,000 articles on 2
# cores with two processes, one loop each serves 16 clients at about the CPU per call one
# client costs, where four call threads each cost 10-20% more (benchmarks/README.md, "16 clients
# at 10,000 articles"). Four calls a loop keep its thread busy while some await LanceDB; a burst
# beyond them waits its turn instead of holding a snapshot and a result's memory each. A process
# thus has as many quick calls in flight (waiting on an LLM endpoint, say) as it had call
# threads: four each of two, eight in one.
QUICK_LOOPS = 2
CALLS_PER_LOOP = 4


def call_loops(processes: int) -> int:
    return max(1, QUICK_LOOPS // max(1, processes))


class CanopyService:
    def __init__(self, ws: Workspace, *, config: Path | None = None, loops: int | None = None,
                 cache_share: int = 1, warm: bool = False) -> None:
        """`config` is the settings file `ws` was opened with when it is not DOCS/canopy.toml;
        `loops`: event loops for quick calls (default: `call_loops(cache_share)`);
        `cache_share`: how many server processes share `[query] cache_mb` and QUICK_LOOPS
        (serve --workers);
        `warm`: load the search indexes' first pages before returning (a server, whose first
        caller should not pay for them; a one-off query need not).
        An index whose database cannot be read raises IndexDamaged; damaged search tables are
        logged, and every call then answers with IndexDamaged until the index is rebuilt."""
        self.ws = ws
        self._warming: threading.Thread | None = None
        self.trimmer: Trimmer | None = None
        try:
            with damage_as_index_damaged(ws.index_dir):
                self._open(ws, config, loops or call_loops(cache_share),
                           max(1, cache_share), warm)
        except IndexDamaged as exc:
            raise exc.for_docs(ws.docs_dir, ws.index_dir) from None
        finally:
            if self._warming is not None:  # the first caller then finds the indexes loaded
                self._warming.join()
        release_free()  # what loading the tokenizer and the search tables left free in malloc
        if warm:  # a server: calls allocate fast and free by reference counts
            relax_collector()
            self.trimmer = Trimmer().start()  # and what its calls free goes back within seconds

    def _open(self, ws: Workspace, config: Path | None, loops: int, share: int,
              warm: bool) -> None:
        self.store = ws.store(must_exist=True)
        if self.store.generation == 0:
            self.store.close()
            raise IndexMissing(f"the index at {ws.index_dir} is empty or was made by an older "
                               f"version: run `canopy index {ws.docs_dir}`")
        self.embedder = make_embedder(ws.settings)
        # The cache budget: 40% search-index pages, 30% views, 30% passage analysis.
        budget = (ws.settings.query.cache_mb << 20) // share
        self.vectors = VectorStore(ws.index_dir, self.embedder.dims or 0,
                                   cache_bytes=budget * 4 // 10)
        if warm:  # LanceDB loads in native threads while the tokenizer loads below
            versions = json.loads(self.store.get_meta("lance_versions", "{}") or "{}")
            self._warming = threading.Thread(target=self.vectors.warm, args=(versions,),
                                             daemon=True, name="canopy-warm")
            self._warming.start()
        preload(ws.settings.chunking.encoding)  # the first answer should not wait for it
        self.provider = make_provider(ws.settings, self.store)
        if not ws.settings.llm.enabled and self.store.get_meta("cjk") == "1":
            threading.Thread(target=load_jieba, daemon=True, name="canopy-jieba").start()
        x, r = ws.settings.extract, ws.settings.reports
        self.view_cache = ViewCache(self.store, memory_bytes=budget * 3 // 10)
        self._views = ViewSupport(self.provider, self.view_cache,
                                  ViewParams(x.summary_max_tokens, r.max_context_tokens,
                                             r.max_report_tokens), self.store)
        self._lanes = {"quick": _CallLoops(loops, CALLS_PER_LOOP, "canopy-call"),
                       "long": _CallLoops(1, CALLS_PER_LOOP, "canopy-long-call")}
        self.caches = EngineCaches.within(budget * 3 // 10)
        self._config = find_config(ws.docs_dir, config)
        self._policy_lock = threading.Lock()
        self._unknown_callers: set[str | None] = set()
        self._policy_source = (self.store.generation, self._config_signature())
        self._policy_error: str | None = None
        try:
            self._policy_fixed = self._read_acl() != ws.settings.acl
        except _UNREADABLE:
            self._policy_fixed = True
        with self.store.snapshot() as snap:
            stale = _relabelled(ws.policy, snap)
        if stale:
            log.warning("the index was labelled under another [acl] policy (%d documents differ, "
                        "e.g. %s): run `canopy index` so document labels follow the current rules",
                        len(stale), stale[0])
        damage = self.search_damage()
        if damage is not None:
            log.error("%s", IndexDamaged(damage).for_docs(ws.docs_dir, ws.index_dir))

    def search_damage(self) -> str | None:
        """Why the committed search tables cannot be read, judged from their files (None:
        nothing found); milliseconds, no table is opened."""
        versions = json.loads(self.store.get_meta("lance_versions", "{}") or "{}")
        return check_search_files(self.ws.index_dir, versions)

    # ---- calls ------------------------------------------------------------------------------

    def use_provider(self, provider: Provider) -> None:
        """Answer and write views with `provider` from now on (tests, benchmarks)."""
        self.provider = provider
        self._views = ViewSupport(provider, self.view_cache, self._views.params, self.store)

    def principal(self, name: str | None) -> Principal:
        with self.store.snapshot() as snap:
            return self._policy(snap.generation).principal(name)

    @contextmanager
    def context(self, who: str | Principal | None,
                progress: ProgressCallback | None = None) -> Iterator[QueryContext]:
        """A QueryContext for `who` (a principal name, or a Principal) over one snapshot of the
        committed generation, on this thread. A damaged index, found while the context is open,
        raises IndexDamaged naming the documents folder."""
        try:
            with damage_as_index_damaged(self.ws.index_dir), self._context(who, progress) as ctx:
                yield ctx
        except IndexDamaged as exc:
            raise exc.for_docs(self.ws.docs_dir, self.ws.index_dir) from None

    @contextmanager
    def _context(self, who: str | Principal | None,
                 progress: ProgressCallback | None) -> Iterator[QueryContext]:
        with self.store.snapshot() as snap:
            generation = snap.generation
            if generation == 0:
                raise IndexMissing(f"no index at {self.ws.index_dir}: run `canopy index "
                                   f"{self.ws.docs_dir}` first")
            # The first call of a newer generation drops analyses of units it no longer has,
            # then hands back what glibc keeps of freed memory: a retired generation's reads and
            # analyses, freed by now, stayed resident in its arenas (benchmarks/soak.py with
            # --diagnostics: glibc's free space grew ~3 MB/min while its memory in use held).
            if self.caches.retire(generation, snap.unit_acl) is not None:
                release_free()
            policy = self._policy(generation)
            name = who.name if isinstance(who, Principal) else who
            if policy.enabled and name not in policy.settings.principals:
                self._warn_unknown(name)
            principal = who if isinstance(who, Principal) else policy.principal(who)
            if isinstance(who, Principal) and policy.enabled:
                principal = policy.principal(who.name)  # grants as they are now
            caller = caller_for(principal, policy, snap.acl_classes())
            versions = json.loads(snap.meta("lance_versions", "{}") or "{}")
            with self.vectors.reading(versions) as vectors:
                reader = CallerReader(snap, caller, views=self._views, vectors=vectors,
                                      embedder=self.embedder,
                                      all_live=snap.meta("revoking") != "1")
                yield QueryContext(reader, self.provider, self.ws.settings.query, progress,
                                   self.caches)

    def _warn_unknown(self, name: str | None) -> None:
        """Log, once per name, a caller the policy does not know: it is served nothing, and
        only the server's log may say why (the caller learns nothing)."""
        if name in self._unknown_callers:
            return
        self._unknown_callers.add(name)
        log.warning("caller %r is not a principal of the [acl] policy: it sees nothing "
                    "(add it to [acl.principals] in %s)", name, self._config or "canopy.toml")

    async def run(self, who: str | Principal | None, fn: Callable[[QueryContext], Awaitable[T]],
                  progress: ProgressCallback | None = None, lane: Lane = "quick") -> T:
        """`fn(ctx)` on one of `lane`'s event loops (`_CallLoops`), with a snapshot of its own;
        progress callbacks are delivered on the calling loop."""
        caller_loop = asyncio.get_running_loop()

        async def relay(done: float, total: float | None, message: str) -> None:
            if progress is not None:
                fut = asyncio.run_coroutine_threadsafe(progress(done, total, message), caller_loop)
                await asyncio.wrap_future(fut)

        async def call() -> T:
            try:
                with self.context(who, relay if progress is not None else None) as ctx:
                    return await fn(ctx)
            finally:
                if self.trimmer is not None:
                    self.trimmer.note()

        return await self._lanes[lane].run(call)

    # ---- policy -----------------------------------------------------------------------------

    def _config_signature(self) -> tuple[int, int, int] | None:
        try:
            st = self._config.stat() if self._config is not None else None
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns) if st is not None else None

    def _read_acl(self) -> AclSettings:
        return load_settings(self.ws.docs_dir, self._config).acl

    def _policy(self, generation: int) -> Policy:
        """The policy to serve `generation` with: re-read when the file or the generation
        changed."""
        if not self._policy_fixed:
            source = (generation, self._config_signature())
            if source != self._policy_source:
                with self._policy_lock:
                    if source != self._policy_source:
                        self._policy_source = source
                        self._reload()
        if self._policy_error is not None:
            raise ConfigError(self._policy_error)
        return self.ws.policy

    def _reload(self) -> None:
        try:
            acl = self._read_acl()
            policy = Policy(acl)
        except _UNREADABLE as exc:
            self._policy_error = (f"the access policy in {self._config} cannot be read, so nothing "
                                  "is served until it is fixed")
            log.error("%s: %s", self._policy_error, exc)
            return
        self._policy_error = None
        if acl == self.ws.policy.settings:
            return
        with self.store.snapshot() as snap:
            stale = _relabelled(policy, snap)
        if stale:
            # Rules changed: document labels follow when the re-index commits. Grants apply now.
            current = self.ws.policy.settings
            merged = current.model_copy(update={"principals": acl.principals})
            log.info(
                "the [acl] rules in %s changed the labels of %d documents (e.g. %s); they apply "
                "when the index update that relabels them commits; principals apply now",
                self._config,
                len(stale),
                stale[0],
            )
            self.ws.policy = Policy(merged)
            return
        log.info("[acl] policy reloaded from %s", self._config)
        self.ws.policy = policy

    def close(self) -> None:
        if self.trimmer is not None:
            self.trimmer.stop()
        for lane in self._lanes.values():
            lane.close()
        self.store.close()


def _relabelled(policy: Policy, snap: object) -> list[str]:
    """Paths of documents whose stored labels are not what `policy`'s rules give them."""
    docs = snap.all_documents()  # type: ignore[attr-defined]
    return sorted(r.document.path for r in docs.values()
                  if tuple(policy.labels_for(r.document.path)) != tuple(r.document.labels))

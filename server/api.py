"""Canopy as a Python library: `Index`, one documents folder and its index.

    from canopy.server.api import Index

    with Index.open("examples/docs") as index:
        index.update()  # build, or bring up to date with the folder
        result = index.local_search("Which supplier makes the battery cells?")
        print(result.answer)

It is the CLI's and the MCP server's machinery called in-process, with no second
implementation: `update`/`build` are `canopy index` (canopy.server.runtime.build_index), the
searches, `drill_down` and `status` are the MCP tools' engines run through the same service
(canopy.server.service.CanopyService), and `export` is `canopy export`. They return the tools'
result models (canopy.server.results.SearchResult, DrillResult, canopy.server.status.IndexStatus).

Permissions: under an [acl] policy every call names its caller with `principal=` (one of the
policy's principals; a missing or unknown name raises ConfigError, as `canopy query` does) and
sees exactly what the tools would serve that principal. Without a policy `principal` may be
omitted: everything is readable.

Calls block until done, also inside a running event loop (a notebook): they then run on a
thread of their own. Errors are Canopy's (canopy.errors): IndexMissing before the first
`update()`, NotFound for an unknown (or hidden) id, InvalidArgument, ConfigError.

This module lives in `server` because it wraps the server's service; the `canopy` package is the
kernel underneath and never imports upward (tests/test_architecture.py). Importing it loads no
engine, store or search code: that happens at the first call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from canopy.indexer.pipeline import IndexResult
    from canopy.server.context import QueryContext
    from canopy.server.results import DrillResult, SearchResult
    from canopy.server.runtime import Workspace
    from canopy.server.service import CanopyService
    from canopy.server.status import IndexStatus

__all__ = ["Index"]

T = TypeVar("T")
RESPONSE = "multiple paragraphs"  # the tools' default response_type


class Index:
    """One documents folder and its index. Open it with `Index.open`; close it (or use it as a
    context manager) to release the store and the threads of its event loops."""

    def __init__(self, docs: str | Path, index_dir: str | Path | None = None,
                 config: str | Path | None = None) -> None:
        from canopy.server.runtime import open_workspace

        self._args = (Path(docs), Path(index_dir) if index_dir else None,
                      Path(config) if config else None)
        self.workspace: Workspace = open_workspace(*self._args)  # checks folder and settings
        self._service: CanopyService | None = None

    @classmethod
    def open(cls, docs: str | Path, index_dir: str | Path | None = None,
             config: str | Path | None = None) -> Index:
        """The index of folder `docs`: in `index_dir` (default docs/.canopy), with the settings
        of `config` (default docs/canopy.toml if present, then CANOPY_* variables). Nothing is
        read or built yet; a missing folder or a bad settings file raises ConfigError."""
        return cls(docs, index_dir, config)

    @property
    def docs_dir(self) -> Path:
        return self.workspace.docs_dir

    @property
    def index_dir(self) -> Path:
        return self.workspace.index_dir

    # ---- indexing ---------------------------------------------------------------------------

    def update(self) -> IndexResult:
        """Build the index, or update it incrementally to match the folder (`canopy index`):
        only what changed is extracted and regenerated. Settings and the [acl] rules are read
        again first, as a watcher does."""
        return self._index(full=False)

    def build(self) -> IndexResult:
        """Rebuild the index from scratch (`canopy index --full`); cached LLM replies are
        reused. A damaged index is moved aside first (IndexResult.recovered says so)."""
        return self._index(full=True)

    def _index(self, *, full: bool) -> IndexResult:
        from canopy.server.runtime import build_index, open_workspace

        return build_index(open_workspace(*self._args), full=full)

    # ---- the tools --------------------------------------------------------------------------

    def global_search(self, query: str, *, principal: str | None = None,
                      community_level: int | None = None,
                      response_type: str = RESPONSE) -> SearchResult:
        """The `global_search` tool: an answer about the corpus as a whole, from community
        reports (`community_level` None: dynamic selection from the top down)."""
        from canopy.server import engines

        return self._call(principal, lambda q: engines.global_search(
            q, query, community_level=community_level, response_type=response_type),
            "global_search")

    def local_search(self, query: str, *, principal: str | None = None,
                     response_type: str = RESPONSE) -> SearchResult:
        """The `local_search` tool: an answer about specific entities, from their neighbourhood
        in the graph and their sources."""
        from canopy.server import engines

        return self._call(principal, lambda q: engines.local_search(
            q, query, response_type=response_type))

    def drift_search(self, query: str, *, principal: str | None = None,
                     response_type: str = RESPONSE) -> SearchResult:
        """The `drift_search` tool: a global primer refined by local follow-up questions."""
        from canopy.server import engines

        return self._call(principal, lambda q: engines.drift_search(
            q, query, response_type=response_type), "drift_search")

    def basic_search(self, query: str, *, principal: str | None = None, k: int = 10,
                     response_type: str = RESPONSE) -> SearchResult:
        """The `basic_search` tool: an answer from the `k` (1-100) most similar passages."""
        from canopy.server import engines

        return self._call(principal, lambda q: engines.basic_search(
            q, query, k=k, response_type=response_type))

    def search(self, query: str, *, principal: str | None = None,
               response_type: str = RESPONSE) -> SearchResult:
        """The `search` tool: the question routed to basic, local or global search; `route`
        says which and why."""
        from canopy.server import engines

        return self._call(principal, lambda q: engines.routed_search(
            q, query, response_type=response_type), "search")

    def drill_down(self, *, community_id: str | None = None, entity: str | None = None,
                   finding: int | None = None, limit: int = 10, offset: int = 0,
                   principal: str | None = None) -> DrillResult:
        """The `drill_down` tool: with no arguments the top-level communities; with
        `community_id` or `entity` one community (report, parents, children, members,
        relationships); with `finding` the sources behind one of its findings."""
        from canopy.server import engines

        return self._call(principal, lambda q: engines.drill_down(
            q, community_id=community_id, entity=entity, finding=finding, limit=limit,
            offset=offset))

    def status(self, *, principal: str | None = None) -> IndexStatus:
        """The `index_status` tool: what the index holds, counted over what `principal` may
        read (everything without a policy)."""
        from canopy.server.status import index_status, status_for_caller

        service = self._opened()
        policy = service.ws.policy

        async def status(q: QueryContext) -> IndexStatus:
            who = q.caller.principal
            return status_for_caller(index_status(service.store), q,
                                     lambda path: policy.readable(policy.labels_for(path), who))

        return self._call(principal, status)

    def export(self, out_dir: str | Path, *, format: str = "parquet",
               principal: str | None = None, overwrite: bool = False) -> Any:
        """`canopy export`: write what `principal` may read to `out_dir` as GraphRAG-shaped
        parquet or CSV tables, or as GraphML (`format`). `out_dir` must be new or empty, or
        hold an earlier export with `overwrite=True`. Returns the GraphRAG wing's
        `ExportResult` (canopy.server.wings.graphrag.export), which the core does not import."""
        from canopy.errors import InvalidArgument
        from canopy.server.wings import wing_module

        export = wing_module("graphrag", "export", wanted_by="Index.export")
        if format not in export.FORMATS:
            raise InvalidArgument(f"unknown format {format!r} (one of "
                                  f"{', '.join(export.FORMATS)})")
        out = Path(out_dir)
        self._check(principal)
        export.prepare_out_dir(out, self.docs_dir, overwrite=overwrite)
        return self._call(principal, lambda q: export.export_tables(q, out, format))

    # ---- plumbing ---------------------------------------------------------------------------

    def _opened(self) -> CanopyService:
        if self._service is None:
            from canopy.server.service import CanopyService

            self._service = CanopyService(self.workspace, config=self._args[2])
        return self._service

    def _check(self, principal: str | None) -> None:
        from canopy.server.cli.common import check_principal

        check_principal(self._opened().ws.policy.settings, principal)

    def _call(self, principal: str | None, fn: Callable[[QueryContext], Awaitable[T]],
              tool: str = "") -> T:
        """`fn(ctx)` for `principal` on the service's event loops (`tool`'s lane), waited
        for."""
        from canopy.server.service import lane_for

        self._check(principal)
        service = self._opened()
        return _blocking(lambda: service.run(principal, fn, lane=lane_for(tool)))

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
            self._service = None

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Index({str(self.docs_dir)!r}, index_dir={str(self.index_dir)!r})"


def _blocking(make: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine `make()` to its end: on this thread, or, when this thread already runs
    an event loop (a notebook cell), on a thread of its own."""

    async def main() -> T:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="canopy-api") as pool:
        return pool.submit(asyncio.run, main()).result()

"""`CanopyService`: one opened index, shared by the MCP server and the CLI query command.

It owns the store, the current generation's IndexView, the provider and the policy, and builds a
per-call `QueryContext` for a principal. Identity comes from the transport (the MCP server's
token verifier, or the stdio principal fixed at start-up), never from tool arguments.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from acl.policy import Principal
from acl.visibility import Visibility, visibility_for
from canopy.providers import make_embedder, make_provider
from canopy.providers.base import Provider
from canopy.settings import QuerySettings
from server.index_view import IndexView, ViewCache
from server.runtime import Workspace

__all__ = ["CanopyService", "ProgressCallback", "QueryContext"]

# progress(done, total, message) - the MCP layer forwards it as progress notifications.
ProgressCallback = Callable[[float, float | None, str], Awaitable[None]]


@dataclass
class QueryContext:
    """Everything one engine call needs; engines take this and nothing global."""

    view: IndexView
    vis: Visibility
    provider: Provider
    settings: QuerySettings
    progress: ProgressCallback | None = None

    async def report_progress(self, done: float, total: float | None, message: str) -> None:
        if self.progress is not None:
            await self.progress(done, total, message)


class CanopyService:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.store = ws.store(must_exist=True)
        self.provider = make_provider(ws.settings, self.store)
        self.embedder = make_embedder(ws.settings)
        self.views = ViewCache(self.store, self.embedder)

    def principal(self, name: str | None) -> Principal:
        return self.ws.policy.principal(name)

    def context(self, principal: Principal, progress: ProgressCallback | None = None) -> QueryContext:
        view = self.views.get()
        vis = visibility_for(principal, self.ws.policy, view.documents, view.units)
        return QueryContext(view, vis, self.provider, self.ws.settings.query, progress)

    def close(self) -> None:
        self.store.close()

"""`CanopyService`: one opened index, shared by the MCP server and the CLI query command.

It owns the store, the current generation's IndexView, the provider and the policy, and builds a
per-call `QueryContext` for a principal. Identity comes from the transport (the MCP server's
token verifier, or the stdio principal fixed at start-up), never from tool arguments.

Policy reload: principals -> labels and the path rules live in canopy.toml; the indexer stamps each
document with the labels the rules give it. The service re-reads the `[acl]` section (same file and
environment the workspace was opened with) whenever the file changes or the committed generation
moves, and adopts it only when its rules reproduce the labels of every document in the served
generation, so principals and document labels always come from the same rules:
- a change of who holds which labels applies at the next request (revocation needs no re-index);
- a change of which labels documents carry applies when the index update that relabels them
  commits; until then the previous policy stays in force.
A policy given programmatically (not reproducible from the file) stays fixed; a file that cannot be
read keeps the last good policy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from acl.policy import Policy, Principal
from acl.visibility import Visibility, visibility_for
from canopy.errors import ConfigError
from canopy.model import Document
from canopy.providers import make_embedder, make_provider
from canopy.providers.base import Provider
from canopy.settings import AclSettings, QuerySettings, find_config, load_settings
from server.index_view import IndexView, ViewCache
from server.runtime import Workspace

__all__ = ["CanopyService", "ProgressCallback", "QueryContext"]

log = logging.getLogger(__name__)

# A settings file that cannot be read or parsed (TOMLDecodeError is a ValueError).
_UNREADABLE = (ConfigError, OSError, ValueError, ValidationError)

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
    def __init__(self, ws: Workspace, *, config: Path | None = None) -> None:
        """`config` is the settings file `ws` was opened with when it is not DOCS/canopy.toml."""
        self.ws = ws
        self.store = ws.store(must_exist=True)
        self.provider = make_provider(ws.settings, self.store)
        self.embedder = make_embedder(ws.settings)
        self.views = ViewCache(self.store, self.embedder)
        self._config = find_config(ws.docs_dir, config)
        self._policy_lock = threading.Lock()
        self._policy_source = (self.store.generation, self._config_signature())
        try:
            self._policy_fixed = self._read_acl() != ws.settings.acl
        except _UNREADABLE:
            self._policy_fixed = True
        stale = _relabelled(ws.policy, self.store.documents().values())
        if stale:
            log.warning("the index was labelled under another [acl] policy (%d documents differ, e.g. %s): "
                        "run `canopy index` so document labels follow the current rules", len(stale), stale[0])

    def principal(self, name: str | None) -> Principal:
        return self._policy_for(self.views.get()).principal(name)

    def context(self, principal: Principal, progress: ProgressCallback | None = None) -> QueryContext:
        before = self.ws.policy
        view = self.views.get()
        policy = self._policy_for(view)
        if policy is not before and principal == before.principal(principal.name):
            principal = policy.principal(principal.name)  # resolved a moment ago, under the old policy
        vis = visibility_for(principal, policy, view.documents, view.units)
        return QueryContext(view, vis, self.provider, self.ws.settings.query, progress)

    def _config_signature(self) -> tuple[int, int, int] | None:
        try:
            st = self._config.stat() if self._config is not None else None
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns) if st is not None else None

    def _read_acl(self) -> AclSettings:
        return load_settings(self.ws.docs_dir, self._config).acl

    def _policy_for(self, view: IndexView) -> Policy:
        """The policy to serve `view` with: re-read when the settings file or the generation changed."""
        if self._policy_fixed:
            return self.ws.policy
        source = (view.generation, self._config_signature())
        if source == self._policy_source:
            return self.ws.policy
        with self._policy_lock:
            if source != self._policy_source:
                self._policy_source = source
                self._reload(view)
        return self.ws.policy

    def _reload(self, view: IndexView) -> None:
        try:
            acl = self._read_acl()
            policy = Policy(acl)
        except _UNREADABLE as exc:
            log.error("the [acl] policy in %s could not be re-read; keeping the previous one: %s",
                      self._config, exc)
            return
        if acl == self.ws.policy.settings:
            return
        stale = _relabelled(policy, view.documents.values())
        if stale:
            log.info("the [acl] policy in %s changed document labels (%d documents, e.g. %s); it applies "
                     "when the index update that relabels them commits", self._config, len(stale), stale[0])
            return
        log.info("generation %d: [acl] policy reloaded from %s", view.generation, self._config)
        self.ws.policy = policy

    def close(self) -> None:
        self.store.close()


def _relabelled(policy: Policy, documents: Iterable[Document]) -> list[str]:
    """Paths of documents whose stored labels are not what `policy`'s rules give them."""
    return sorted(d.path for d in documents if tuple(policy.labels_for(d.path)) != tuple(d.labels))

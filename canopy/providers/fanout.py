"""`Fanout`: what the provider factory needs of a place a build's work can run besides this
process (the Ray wing's executor, `canopy index --ray`).

The kernel names only this protocol, so the provider factory never imports the wing that
implements it (tests/test_architecture.py: no core module imports a wing, and the import graph
has no circle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from canopy.endpoint import Endpoint, EndpointConfig
    from canopy.providers.base import Embedder, Provider
    from canopy.settings import EmbedSettings

__all__ = ["Fanout", "FanoutStats"]


class FanoutStats(Protocol):
    """What the cluster did for one build, as `IndexResult.stats["ray"]` records it."""

    def as_dict(self) -> dict[str, Any]: ...


class Fanout(Protocol):
    """Endpoint requests and the builtin provider's CPU work, sent elsewhere with the results
    a local build gets."""

    def endpoints(self, config: EndpointConfig) -> Endpoint:
        """`canopy.endpoint.EndpointFactory`: this endpoint's requests, sent from there."""
        ...

    def builtin_provider(self) -> Provider:
        """The builtin provider, its extraction run there."""
        ...

    def builtin_embedder(self, local: Embedder, settings: EmbedSettings) -> Embedder:
        """`local` (the builtin embedder of `settings`), its batches embedded there."""
        ...

    def stats(self) -> FanoutStats: ...

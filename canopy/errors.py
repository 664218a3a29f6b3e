"""Canopy's errors. The server turns each into a message written for the agent; raw exception
text from libraries never reaches a caller.

    CanopyError
    ├── ConfigError            bad settings or policy (user-facing, no traceback)
    ├── IndexMissing           no index at the given folder yet
    ├── ProviderError          an LLM/embedding endpoint failed
    │   ├── EndpointUnavailable   unreachable / auth failure / retries exhausted
    │   └── InvalidOutput         output failed validation after repair (per-unit failure)
    ├── NotFound               unknown id; hidden ids raise exactly the same message
    └── InvalidArgument        a tool or CLI argument out of range
"""

from __future__ import annotations

__all__ = [
    "CanopyError",
    "ConfigError",
    "EndpointUnavailable",
    "IndexMissing",
    "InvalidArgument",
    "InvalidOutput",
    "NotFound",
    "ProviderError",
]


class CanopyError(Exception):
    """Base of every error Canopy raises on purpose."""


class ConfigError(CanopyError):
    pass


class IndexMissing(CanopyError):
    pass


class ProviderError(CanopyError):
    pass


class EndpointUnavailable(ProviderError):
    pass


class InvalidOutput(ProviderError):
    pass


class NotFound(CanopyError):
    pass


class InvalidArgument(CanopyError):
    pass

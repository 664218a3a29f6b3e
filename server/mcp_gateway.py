"""What every MCP tool and resource shares (design §6): who is calling, the per-call
`QueryContext`, progress notifications and the translation of errors into messages for the agent.

The server's lifespan yields one `Gateway`; a tool reaches it the SDK's way, through its
`Context` (`gateway_of`), so each tool is a plain module-level function (canopy.server.mcp_tools)
that a test can call with a context it built.

Errors: `InvalidArgument`, `NotFound`, `IndexMissing`, `ConfigError` and an unavailable endpoint
become `ToolError`s carrying their message, which is written for the agent (a hidden id reads
exactly like a missing one). `IndexDamaged` becomes a fixed message with its reason (no paths):
the index is damaged and the operator should rebuild it. Other provider failures get a fixed
message. Anything else is logged with its traceback on stderr and reaches the agent as
"Internal error in <tool>; see server log": raw exception text never leaves the server.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

from mcp.server import MCPServer
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError

from canopy.errors import (
    ConfigError,
    EndpointUnavailable,
    IndexDamaged,
    IndexMissing,
    IndexUnwritable,
    InvalidArgument,
    NotFound,
    ProviderError,
)
from canopy.server.context import QueryContext
from canopy.server.first_build import ServiceSlot
from canopy.server.service import CanopyService, lane_for

__all__ = ["CanopyServer", "FailureKind", "Gateway", "ResourceFailure", "ToolFailure",
           "damaged_message", "gateway_of", "unwritable_message"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors whose message is written for the agent and safe to forward as is.
_FORWARDED = (InvalidArgument, NotFound, IndexMissing, ConfigError, EndpointUnavailable)

FailureKind = Literal["invalid_argument", "not_found", "unavailable", "llm_failed", "internal"]


class ToolFailure(ToolError):
    """A tool's refusal, carrying what kind of failure it is: MCP clients read the message only;
    the REST wing's API answers with the status code the kind implies."""

    def __init__(self, message: str, kind: FailureKind) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


class ResourceFailure(ResourceError):
    """A resource read's refusal with its kind, as `ToolFailure` (the REST API's status)."""

    def __init__(self, message: str, kind: FailureKind) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


def _kind(exc: Exception) -> FailureKind:
    if isinstance(exc, InvalidArgument):
        return "invalid_argument"
    if isinstance(exc, NotFound):
        return "not_found"
    if isinstance(exc, EndpointUnavailable):
        return "llm_failed"
    return "unavailable"  # IndexMissing (a first build runs) or an unreadable policy


def damaged_message(exc: IndexDamaged) -> str:
    """What an agent reads when the index is damaged: no paths, and who can fix it."""
    return (f"The Canopy index is damaged ({exc.reason}), so no tool can answer until it is "
            "rebuilt. Tell the operator to run `canopy index --full` on the documents folder.")


def unwritable_message(exc: IndexUnwritable) -> str:
    """What an agent reads when the index folder cannot be used (a full disk, a read-only
    folder): the problem without its path (the server log has it), and who can fix it."""
    return (f"Canopy cannot use its index right now ({exc.problem}). Tell the operator: the "
            "server log names the folder and what to do.")


class _Progress:
    """Forwards engine progress as MCP progress notifications, whose value must always increase.

    Engines count each phase from zero (rate reports, map, reduce); a count that goes back starts
    a new phase, which continues one step above the last value sent. The message names the phase.
    """

    def __init__(self, mcp_ctx: Context) -> None:
        self.mcp_ctx = mcp_ctx
        self.base = 0.0
        self.done = 0.0
        self.last: float | None = None

    async def __call__(self, done: float, total: float | None, message: str) -> None:
        if self.last is not None and done < self.done:
            self.base = self.last + 1 - done
        self.done = done
        value = self.base + done
        if self.last is not None and value <= self.last:
            return
        self.last = value
        try:
            await self.mcp_ctx.report_progress(
                value, None if total is None else self.base + total, message
            )
        except Exception:  # a vanished client must not fail the query
            log.debug("progress notification not delivered", exc_info=True)


class Gateway:
    """Identity, per-call QueryContext and error translation, shared by every tool and resource:
    the server's lifespan context."""

    def __init__(self, slot: ServiceSlot, principal_name: str | None) -> None:
        self.slot = slot
        self.principal_name = principal_name

    @property
    def service(self) -> CanopyService:
        """The opened service; IndexMissing (forwarded to the agent) during a first build."""
        return self.slot.service

    def caller(self) -> str | None:
        """The verified HTTP caller when a token verifier ran, else the start-up principal."""
        token = get_access_token()
        if token is not None:
            return token.subject or token.client_id
        return self.principal_name

    async def call(self, tool: str, mcp_ctx: Context | None,
                   fn: Callable[[QueryContext], Awaitable[T]]) -> T:
        """`fn` on one of the service's event loops (its lane chosen by `tool`), for the
        transport's caller; progress goes to `mcp_ctx`'s client when it is in a request."""
        progress = _Progress(mcp_ctx) if mcp_ctx is not None and _in_request(mcp_ctx) else None
        try:
            service = self.service
            return await service.run(self.caller(), fn, progress, lane_for(tool))
        except IndexDamaged as exc:
            log.error("%s: %s", tool, exc)
            raise ToolFailure(damaged_message(exc), "unavailable") from None
        except IndexUnwritable as exc:  # the log names the folder; the agent is told the kind
            log.error("%s: %s", tool, exc)
            raise ToolFailure(unwritable_message(exc), "unavailable") from None
        except _FORWARDED as exc:
            raise ToolFailure(str(exc), _kind(exc)) from None
        except ProviderError:  # its text may quote model output: keep it in the log
            log.exception("%s failed", tool)
            raise ToolFailure(f"The language model endpoint failed during {tool}; see server "
                              "log. drill_down and the canopy:// resources work without it.",
                              "llm_failed") from None
        except Exception:
            log.exception("%s failed", tool)
            raise ToolFailure(f"Internal error in {tool}; see server log", "internal") from None

    async def read(self, uri: str, fn: Callable[[QueryContext], Awaitable[str]]) -> str:
        """`fn`'s text for a resource read, its failures as the resource errors of the SDK."""
        try:
            return await self.service.run(self.caller(), fn)
        except IndexDamaged as exc:
            log.error("reading %s: %s", uri, exc)
            raise ResourceFailure(damaged_message(exc), "unavailable") from None
        except IndexUnwritable as exc:
            log.error("reading %s: %s", uri, exc)
            raise ResourceFailure(unwritable_message(exc), "unavailable") from None
        except NotFound as exc:
            raise ResourceNotFoundError(str(exc)) from None
        except _FORWARDED as exc:
            raise ResourceFailure(str(exc), _kind(exc)) from None
        except Exception:
            log.exception("reading %s failed", uri)
            raise ResourceFailure(f"Internal error reading {uri}; see server log",
                                  "internal") from None


class CanopyServer(MCPServer[Gateway]):
    """An `MCPServer` whose lifespan context is `gateway`; it also keeps the gateway for calls
    made outside any MCP request (the REST API calls tools through `MCPServer.call_tool`)."""

    def __init__(self, gateway: Gateway, name: str, **kwargs: Any) -> None:
        @asynccontextmanager
        async def lifespan(_: MCPServer[Gateway]) -> AsyncIterator[Gateway]:
            yield gateway

        super().__init__(name, lifespan=lifespan, **kwargs)
        self.gateway = gateway


def _in_request(ctx: Context) -> bool:
    try:
        return ctx.request_context is not None
    except ValueError:  # the SDK's word for "no request behind this context"
        return False


def gateway_of(ctx: Context) -> Gateway:
    """The Gateway behind a tool's `ctx`: its request's lifespan context, or, for a call made
    outside any request, the one its `CanopyServer` keeps."""
    state: object = (ctx.request_context.lifespan_context if _in_request(ctx)
                     else getattr(ctx.mcp_server, "gateway", None))
    if not isinstance(state, Gateway):
        raise TypeError("a Canopy tool was called on a server that is not Canopy's")
    return state

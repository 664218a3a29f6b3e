"""The MCP tools as plain functions (canopy.server.mcp_tools): each is importable and callable
with a `Context` a test builds, whose request's lifespan context is the server's `Gateway`; the
SDK transports are exercised in test_mcp_server.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.server.session import ServerSession

from canopy.server.first_build import ServiceSlot
from canopy.server.mcp_gateway import Gateway, ToolFailure, gateway_of
from canopy.server.mcp_tools import drill_down, global_search, index_status_tool
from canopy.server.service import CanopyService

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class RecordingSession:
    """The one session method a tool uses: progress notifications, recorded."""

    progress: list[tuple[float, float | None, str | None]] = field(default_factory=list)

    async def report_progress(self, progress: float, total: float | None = None,
                              message: str | None = None) -> None:
        self.progress.append((progress, total, message))


def request_context(gateway: Gateway, session: RecordingSession) -> Context:
    return Context(request_context=ServerRequestContext[Any, Any](
        session=cast(ServerSession, session), lifespan_context=gateway,
        protocol_version="2025-06-18", method="tools/call"))


async def test_global_search_called_directly_answers_from_the_lifespan_gateway_with_progress(
    examples_service: CanopyService,
) -> None:
    session = RecordingSession()
    ctx = request_context(Gateway(ServiceSlot(examples_service), None), session)
    result = await global_search("What are the main risks across the supply chain?", ctx)
    assert result.structured_content is not None
    assert result.structured_content["method"] == "global"
    assert "Helio Cells" in result.content[0].text  # type: ignore[union-attr]
    values = [p for p, _, _ in session.progress]
    assert values and values == sorted(set(values))  # MCP progress only ever increases


async def test_a_tool_called_directly_forwards_not_found_as_a_tool_failure(
    examples_service: CanopyService,
) -> None:
    ctx = request_context(Gateway(ServiceSlot(examples_service), None), RecordingSession())
    with pytest.raises(ToolFailure) as raised:
        await drill_down(ctx, community_id="c1-0000000000")
    assert raised.value.kind == "not_found"


async def test_index_status_counts_only_what_the_gateways_principal_may_read(
    examples_service: CanopyService,
) -> None:
    ctx = request_context(Gateway(ServiceSlot(examples_service), None), RecordingSession())
    status = (await index_status_tool(ctx)).structured_content
    assert status is not None and status["documents"] > 0


def test_a_context_without_a_canopy_gateway_is_refused() -> None:
    with pytest.raises(TypeError):
        gateway_of(Context(request_context=ServerRequestContext[Any, Any](
            session=cast(ServerSession, RecordingSession()), lifespan_context={},
            protocol_version="2025-06-18", method="tools/call")))

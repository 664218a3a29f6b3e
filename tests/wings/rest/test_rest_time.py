"""The REST API's search endpoints take `since` / `until` (issue 31, "Time"): they are the MCP
tools' own argument schemas, so the window, its validation and its message are the tools'. Over
tests/server/engines/test_time.py's dated DEV subset of MultiHop-RAG."""

from __future__ import annotations

import httpx2

from canopy.server.mcp_app import build_server
from canopy.server.service import CanopyService
from tests.server.engines.test_time import WINDOW, news, paths_in
from tests.wings.rest.test_rest import in_process

__all__ = ["news"]  # the module fixture, built once for this module


def test_the_rest_api_takes_since_and_until(news: tuple[CanopyService, dict[str, str]]) -> None:
    svc, dates = news
    inside = {p for p, d in dates.items() if "2023-11-01" <= d <= "2023-11-30"}
    with in_process(build_server(svc, principal_name="editor")) as base:
        ok = httpx2.post(f"{base}/api/v1/basic_search",
                         json={"query": "OpenAI board", "k": 20, **WINDOW}, timeout=60)
        bad = httpx2.post(f"{base}/api/v1/global_search",
                          json={"query": "themes", "since": "2023-12", "until": "2023-11"},
                          timeout=60)
    assert ok.status_code == 200
    assert paths_in(ok.json()) and paths_in(ok.json()) <= inside
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_argument"
    assert "the window is empty" in bad.json()["message"]

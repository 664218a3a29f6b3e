"""The query engines behind the MCP tools and `canopy query` (design §6).

Each engine takes a `QueryContext` (the committed index view, the caller's visibility, the
provider and the query settings) and returns a result model from `server.results`. Every
artifact they read passes the serving rule through `server.engines.serving`.

- `global_search`: map-reduce over community reports, for questions about the whole corpus;
- `local_search`: an entity's neighbourhood, for questions about particular things;
- `drift_search`: a global primer refined by local follow-ups;
- `basic_search`: plain vector + BM25 retrieval over text units;
- `drill_down`, `source_span`, `report_markdown`, `list_servable_reports`: navigation.

Callers who cannot read everything are served per-caller views where canonical artifacts touch
units they cannot read (server.engines.serving, acl.views).
"""

from __future__ import annotations

from server.engines import drift_engine, drill, global_engine, local_engine
from server.engines.basic_engine import basic_search
from server.engines.drill import list_servable_reports, report_markdown, source_span
from server.engines.serving import run_with_views, servable_entity, servable_report, with_views

# The engines that may read per-caller views (acl.views) run pass after pass until every view
# they need is built (serving.run_with_views); basic_search reads text units only. The sync
# navigation functions need run_with_views(ctx, lambda c: report_markdown(c, id)) when the
# caller may be served views (the MCP resources do this).
global_search = with_views(global_engine.global_search)
local_search = with_views(local_engine.local_search)
drift_search = with_views(drift_engine.drift_search)
drill_down = with_views(drill.drill_down)

__all__ = [
    "basic_search",
    "drift_search",
    "drill_down",
    "global_search",
    "list_servable_reports",
    "local_search",
    "report_markdown",
    "run_with_views",
    "servable_entity",
    "servable_report",
    "source_span",
]

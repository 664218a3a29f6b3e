"""The query engines behind the MCP tools and `canopy query` (design §6).

Each engine takes a `QueryContext` (canopy.server.context): a caller-scoped reader of one committed
generation (canopy.acl.reader), the provider and the query settings; it returns a result model from
`canopy.server.results`. Engines read the index only through the reader, which applies the serving
rule and builds per-caller views as needed, so no engine can serve what its caller may not read.

- `global_search`: map-reduce over community reports, for questions about the whole corpus;
- `local_search`: an entity's neighbourhood, for questions about particular things;
- `drift_search`: a global primer refined by local follow-ups;
- `basic_search`: plain vector + BM25 retrieval over text units;
- `routed_search`: classifies the question and hands it to basic, local or global (the `search`
  tool, `canopy query -m auto`);
- `drill_down`, `source_span`, `report_markdown`, `list_servable_reports`: navigation.
"""

from __future__ import annotations

from canopy.server.engines.basic_engine import basic_search
from canopy.server.engines.drift_engine import drift_search
from canopy.server.engines.drill import (
    drill_down,
    list_servable_reports,
    report_markdown,
    source_span,
)
from canopy.server.engines.global_engine import global_search
from canopy.server.engines.local_engine import local_search
from canopy.server.engines.router import routed_search

__all__ = [
    "basic_search",
    "drift_search",
    "drill_down",
    "global_search",
    "list_servable_reports",
    "local_search",
    "report_markdown",
    "routed_search",
    "source_span",
]

"""`canopy.lance.import_lancedb`: lancedb without the REST namespace client's start-up, with the
client still there for whoever reads it. Each check runs in a fresh interpreter, since this
test process may have imported lancedb already."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_rest_client_api_is_not_built_but_loads_on_demand() -> None:
    out = _run("""
        import sys
        from canopy.lance import import_lancedb
        import_lancedb()
        api = [m for m in sys.modules if m.startswith("lance_namespace_urllib3_client.api.")]
        print(len(api))
        import lance_namespace_urllib3_client as client
        print(client.ApiClient.__name__, client.Configuration.__name__)
        api = [m for m in sys.modules if m.startswith("lance_namespace_urllib3_client.api.")]
        print(len(api) > 0)
    """)
    assert out.splitlines() == ["0", "ApiClient Configuration", "True"]


def test_local_tables_work_through_the_deferred_import(tmp_path: Path) -> None:
    out = _run(f"""
        from canopy.lance import import_lancedb
        lancedb = import_lancedb()
        db = lancedb.connect({str(tmp_path)!r})
        rows = [{{"id": "a", "text": "tiny kettle", "vector": [0.0, 1.0]}},
                {{"id": "b", "text": "large anvil", "vector": [1.0, 0.0]}}]
        table = db.create_table("t", data=rows)
        table.create_fts_index("text", replace=True)
        print(table.search([0.9, 0.1]).limit(1).to_list()[0]["id"])
        print(table.search("anvil", query_type="fts").limit(1).to_list()[0]["id"])
        print(table.count_rows())
    """)
    assert out.splitlines() == ["b", "b", "2"]

"""canopy.collector: large imports are frozen out of the cyclic GC once, not once per build.

Each case runs in a fresh interpreter: `gc.freeze` is process-wide, and the test process has
imported everything long ago."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import gc, json, sys
import canopy.server.runtime  # what every Canopy command imports first
from canopy.collector import freeze_imports
from canopy.lance import import_lancedb
out = {"start": gc.get_freeze_count()}
out["first"] = freeze_imports()            # what was imported so far
out["again"] = freeze_imports()            # nothing new since: no freeze
out["frozen_first"] = gc.get_freeze_count()
import_lancedb()                           # a large import freezes its objects
out["after_lancedb"] = gc.get_freeze_count()
out["lancedb_again"] = (import_lancedb(), gc.get_freeze_count())[1]
gc.collect()
print(json.dumps(out))
"""


def probe() -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_large_import_is_frozen_once_and_repeat_calls_freeze_nothing() -> None:
    out = probe()
    assert out["start"] == 0
    assert out["first"] is True and out["again"] is False
    first, frozen = out["frozen_first"], out["after_lancedb"]
    assert isinstance(first, int) and isinstance(frozen, int)
    assert first > 10_000  # the modules every command imports
    assert frozen > first + 20_000  # and then LanceDB's (its pydantic models, pyarrow's types)
    assert out["lancedb_again"] == frozen  # importing it again freezes nothing more

"""What an offline run imports: the `openai` SDK (most of a second of CPU to import) only when an
endpoint is used. Each check runs in a fresh interpreter, since this test process has imported
the SDK already."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def _run(code: str, tmp_path: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANOPY_")}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_an_offline_build_never_imports_the_sdk(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Harbor\n\nAda Lovelace met Charles Babbage in London.\n")
    out = _run(f"""
        import sys
        from pathlib import Path
        from canopy.server.runtime import build_index, open_workspace
        ws = open_workspace(Path({str(docs)!r}), Path({str(tmp_path / "idx")!r}))
        result = build_index(ws, tidy=False)
        print(result.stats["documents"], "openai" in sys.modules)
        from canopy.endpoint import JsonEndpoint
        JsonEndpoint("http://127.0.0.1:9/v1", "k", timeout_s=1, connections=1)
        print("openai" in sys.modules)
    """, tmp_path)
    # imported for the endpoint made last, not for the build
    assert out == ["1", "False", "True"]

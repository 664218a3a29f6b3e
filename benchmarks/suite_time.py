"""How long the test commands take, and what their installs weigh, on this machine.

    python benchmarks/suite_time.py                   # the default suite, as .ci/run runs it
    python benchmarks/suite_time.py --commands heavy --add   # the heavy one, into the same file
    python benchmarks/suite_time.py --sizes           # only the installed sizes, no test command
    python benchmarks/suite_time.py --sizes --venv    # and what a fresh venv of `.[test]` weighs

The default suite is run exactly as `.ci/run` runs it (`python -m pytest` with REQUIRE_EVAL_DATA
and REQUIRE_WINGS set, so a skip would fail), its wall time taken around the process, and
pytest's own summary line kept (tests passed, its seconds, the xdist workers it started). The
load average before and after says how quiet the machine was. Every run also records the
installed MB of the distributions that make an environment heavy (the files their RECORD
lists), the figures behind which extra each library goes in; `--venv` also installs `.[test]`
into a fresh virtual environment (as the README's test command does in a new checkout) and
weighs the whole folder.

Output: a line per command on stdout, and JSON in benchmarks/results/suite_time.json (commit,
command, machine, load, per command its wall seconds, summary and workers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.multihop import machine  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "suite_time.json"
DEFAULT_ENV = {"REQUIRE_EVAL_DATA": "1", "REQUIRE_WINGS": "rest,web,publish,graphrag,eval"}
HEAVY_ENV = {"REQUIRE_EVAL_DATA": "1", "REQUIRE_CHROMIUM": "1", "REQUIRE_HEAVY": "1",
             "REQUIRE_WINGS": "all"}
COMMANDS = {"default": ([], DEFAULT_ENV), "heavy": (["-m", "heavy"], HEAVY_ENV)}
# The distributions whose weight decides which extra a library goes in (docs/development.md).
WEIGHED = ("ray", "grpcio", "moto", "botocore", "schemathesis", "jsonschema-rs",
           "llama_cpp_python", "lancedb", "pyarrow", "wordllama", "mypy", "hypothesis",
           "pytest-xdist")
_SUMMARY = re.compile(r"^=*\s*(?P<line>(\d+ (passed|failed|error|errors|skipped|deselected)"
                      r"[^=]*?in [\d.]+s[^=]*?))\s*=*$")
_WORKERS = re.compile(r"created: (\d+)/\d+ workers|(\d+) workers \[")


def run_command(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run one test command in the repository; its wall seconds, summary line and workers."""
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, env={**os.environ, **env}, capture_output=True,
                          text=True, check=False)
    wall = time.monotonic() - started
    out = done.stdout + done.stderr
    summary = next((m.group("line") for line in reversed(out.splitlines())
                    if (m := _SUMMARY.match(line.strip()))), None)
    workers = next((int(a or b) for a, b in _WORKERS.findall(out)), 1)
    return {"argv": argv, "env": env, "exit_code": done.returncode, "wall_s": round(wall, 1),
            "summary": summary, "workers": workers, "tail": out.splitlines()[-15:]}


def installed_mb(name: str) -> float | None:
    """Installed MB of distribution `name` (the files its RECORD lists); None: not installed."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    total = 0
    for file in dist.files or ():
        path = Path(str(dist.locate_file(file)))
        if path.is_file():
            total += path.stat().st_size
    return round(total / 2**20, 1)


def venv_mb(extra: str = "test") -> dict[str, Any]:
    """Install the checkout with `extra` into a fresh venv; its folder's MB and the seconds."""
    import tempfile
    import venv

    with tempfile.TemporaryDirectory(prefix="canopy-venv-") as tmp:
        started = time.monotonic()
        venv.create(tmp, with_pip=True)
        python = str(Path(tmp) / "bin" / "python")
        done = subprocess.run([python, "-m", "pip", "install", "-q", "-e", f".[{extra}]"], cwd=REPO,
                              capture_output=True, text=True, check=False)
        seconds = time.monotonic() - started
        total = sum(f.stat().st_size for f in Path(tmp).rglob("*")
                    if f.is_file() and not f.is_symlink())
    return {"extra": extra, "exit_code": done.returncode, "mb": round(total / 2**20, 1),
            "install_s": round(seconds, 1), "stderr_tail": done.stderr.splitlines()[-5:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commands", default="default",
                        help="default, heavy or both (comma-separated), run in that order; "
                        ".ci/run runs the default one before installing [heavy]")
    parser.add_argument("--add", action="store_true",
                        help="add to --out's record (same commit) instead of starting one")
    parser.add_argument("--sizes", action="store_true",
                        help="only the installed sizes, no test command")
    parser.add_argument("--venv", action="store_true",
                        help="also weigh a fresh venv with the [test] extra installed")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    record: dict[str, Any] = {}
    if args.add and args.out.exists():
        record = json.loads(args.out.read_text(encoding="utf-8"))
    now = machine()
    if record and record.get("commit") != now["commit"]:
        raise SystemExit(f"{args.out} is of {record.get('commit')}, this checkout {now['commit']}")
    record.setdefault("machine", now)
    record["commit"] = now["commit"]
    record.setdefault("load_before", os.getloadavg())
    command = " ".join(["python", "benchmarks/suite_time.py", *sys.argv[1:]])
    record["command"] = "; ".join(filter(None, [record.get("command") if args.add else None,
                                                command]))
    record["sizes_mb"] = {name: installed_mb(name) for name in WEIGHED}
    wanted = [] if args.sizes else [c.strip() for c in args.commands.split(",") if c.strip()]
    for name in wanted:
        if name not in COMMANDS:
            raise SystemExit(f"unknown command {name!r}: default or heavy")
        extra, env = COMMANDS[name]
        # -v against addopts' -q: pytest's default verbosity, at which xdist says how many
        # workers it started ("created: 2/2 workers"); at -q it says nothing of them.
        record[name] = run_command([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                    "-v", *extra], env)
        print(f"{name} suite: {record[name]['summary']} (wall {record[name]['wall_s']} s, "
              f"{record[name]['workers']} workers)")
    if args.venv:
        record["venv"] = venv_mb()
        print(f"a fresh venv of .[test]: {record['venv']['mb']} MB "
              f"(installed in {record['venv']['install_s']} s)")
    record["load_after"] = os.getloadavg()
    for name, mb in record["sizes_mb"].items():
        print(f"{name}: {'not installed' if mb is None else f'{mb} MB'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

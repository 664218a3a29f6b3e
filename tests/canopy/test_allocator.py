"""canopy.allocator: Canopy's processes keep glibc's malloc arenas at two (index build peaks and
server memory; see the module)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="malloc arenas are glibc's")

# Eight threads allocating at once through libc, then malloc_info's count of heaps (arenas).
PROBE = """
import ctypes, os, sys, tempfile, threading
from canopy.allocator import limit_arenas
capped = limit_arenas() if sys.argv[1] == "cap" else None
again = limit_arenas() if sys.argv[1] == "cap" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.fdopen.restype = ctypes.c_void_p
libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fflush.argtypes = [ctypes.c_void_p]
barrier = threading.Barrier(8)

def work():
    barrier.wait()
    for _ in range(50):
        for p in [libc.malloc(2000) for _ in range(500)]:
            libc.free(p)

threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with tempfile.TemporaryFile() as f:
    fp = libc.fdopen(os.dup(f.fileno()), b"w")
    libc.malloc_info(0, fp)
    libc.fflush(fp)
    f.seek(0)
    heaps = f.read().decode().count("<heap nr=")
print(capped, again, heaps)
"""


def probe(mode: str, **env: str) -> tuple[str, str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=REPO, capture_output=True,
                         text=True, check=True, env={**environ, "PYTHONPATH": str(REPO), **env})
    capped, again, heaps = out.stdout.split()
    return capped, again, int(heaps)


def test_threads_share_two_arenas_once_capped() -> None:
    assert probe("cap") == ("True", "True", 2)
    assert probe("none")[2] > 2  # the same threads, uncapped, spread over more arenas


def test_malloc_arena_max_in_the_environment_wins() -> None:
    capped, _, heaps = probe("cap", MALLOC_ARENA_MAX="3")
    assert capped == "False" and heaps == 3


def test_the_cli_and_build_index_cap_the_arenas(example_docs: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways into a build ask for the cap before their work starts."""
    from click.testing import CliRunner

    import canopy.indexer.index_writer
    import canopy.server.cli

    calls: list[str] = []
    monkeypatch.setattr(canopy.indexer.index_writer, "limit_arenas",
                        lambda: calls.append("build") or True)
    monkeypatch.setattr(canopy.server.cli, "limit_arenas", lambda: calls.append("cli") or True)
    result = CliRunner().invoke(canopy.server.cli.main, ["index", str(example_docs)])
    assert result.exit_code == 0, result.output
    assert calls[:2] == ["cli", "build"]


RELEASE = """
import sys, threading
from canopy.allocator import limit_arenas, release_free
limit_arenas()

def rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def churn():  # malloc'd objects, most freed, a few survivors pinning the arena's top
    made = [bytes(2000) for _ in range(40_000)]
    sys.modules[__name__].kept = made[::16]
    del made

t = threading.Thread(target=churn)
t.start(); t.join()
before = rss_kb()
released = release_free()
print(released, before - rss_kb())
"""


def test_release_free_hands_free_arena_pages_back() -> None:
    out = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    released, freed_kb = out.stdout.split()
    assert released == "True"
    assert int(freed_kb) > 10_000  # tens of MB the thread's arena kept after its objects died


def test_a_build_hands_freed_memory_back_after_each_stage(
        example_docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between stages the build returns what the stage freed (its vectors stage allocates on
    LanceDB's threads, which cannot reuse the graph stages' free arena space)."""
    import canopy.indexer.pipeline
    from canopy.server.runtime import build_index, open_workspace

    calls: list[int] = []
    monkeypatch.setattr(canopy.indexer.pipeline, "release_free", lambda: calls.append(1) or True)
    result = build_index(open_workspace(example_docs, tmp_path / "index"))
    assert len(calls) == len(result.stats["seconds"]) - 1 >= 8  # every stage but the plan


def test_a_server_collects_cycles_less_often(examples_index: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's service raises the young generation's threshold (calls free nearly all they
    allocate by reference counts); a one-off query's leaves it alone."""
    import gc

    from canopy.allocator import SERVER_GC_THRESHOLD
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    before = gc.get_threshold()
    monkeypatch.setattr(gc, "set_threshold", lambda *t: seen.append(t))
    seen: list[tuple[int, ...]] = []
    for warm in (False, True):
        CanopyService(open_workspace(EXAMPLES, index_dir=examples_index), warm=warm).close()
    assert seen == [(SERVER_GC_THRESHOLD, *before[1:])]


def test_the_trimmer_trims_after_calls_and_not_while_idle() -> None:
    from canopy.allocator import Trimmer

    trims: list[int] = []
    t = Trimmer(every=3600, trim=lambda: trims.append(1) or True)
    assert not t.tick() and trims == []  # nothing served since it started: no trim
    t.note()
    t.note()
    assert t.tick() and trims == [1]  # the calls finished since the last trim: one trim
    assert not t.tick() and trims == [1]  # idle again
    assert t.trims == 1 and t.seconds >= 0


def test_a_server_trims_within_seconds_of_its_calls(examples_index: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's service (warm) runs a trimmer that each finished call wakes; a one-off
    query's service has none."""
    import asyncio
    import threading

    import canopy.allocator
    from canopy.server.engines import basic_search
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    monkeypatch.setattr(canopy.allocator, "TRIM_EVERY_S", 0.05)
    monkeypatch.setattr(canopy.allocator.Trimmer.__init__, "__defaults__", (0.05, None))
    trimmed = threading.Event()
    monkeypatch.setattr(canopy.allocator, "release_free", lambda: trimmed.set() or True)
    assert CanopyService(open_workspace(EXAMPLES, index_dir=examples_index)).trimmer is None
    svc = CanopyService(open_workspace(EXAMPLES, index_dir=examples_index), warm=True)
    try:
        assert svc.trimmer is not None
        trimmed.clear()  # (opening the service trims once itself, by name in its module)
        time.sleep(0.2)
        assert not trimmed.is_set()  # idle: never woken
        asyncio.run(svc.run(None, lambda c: basic_search(c, "cranes", k=3)))
        assert trimmed.wait(5)  # the call's freed memory goes back within a tick
        assert svc.trimmer.trims >= 1
    finally:
        svc.close()
    assert svc.trimmer._thread is None  # closing the service stops its thread

"""An opt-in memory report of a serving process, for soaks (benchmarks/soak.py): what the
caches hold, which per-generation objects are alive, and where native memory sits (glibc's
arenas one by one from malloc_info, Python's small-object allocator from its own statistics).

Off unless the environment sets CANOPY_DIAGNOSTICS=1, and then served only on a loopback host
(GET /debug/memory, beside /mcp): the report names no document, but counts of what a process
holds are nobody else's business. `?objects=1` adds live objects counted by type (a walk of
the heap: about a second at a few million objects, with the GIL held). When tracemalloc traces
(PYTHONTRACEMALLOC=N), every report adds the traced total and the lines whose allocations grew
most since the first report (no heap walk; the snapshot is slow under load).
The walk can disturb the calls running meanwhile: gc.get_objects() hands out tuples another
thread is still building, whose resize then fails (one global_search of a soak answered
"SystemError: bad argument to internal function", even with only len(gc.get_objects()) in
each report); so only a request that asks walks, and a soak's figures come from runs that
never ask.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
import threading
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from canopy.server.first_build import ServiceSlot
    from canopy.server.service import CanopyService

__all__ = ["DIAGNOSTICS_ENV", "DIAGNOSTICS_PATH", "malloc_arenas", "memory_report",
           "mount_diagnostics", "pymalloc_mb"]

DIAGNOSTICS_ENV = "CANOPY_DIAGNOSTICS"
DIAGNOSTICS_PATH = "/debug/memory"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Types whose live instances tell per-generation objects from a cache (counted on every report).
_WATCHED = ("Connection", "Store", "Snapshot", "VectorStore", "VectorReader", "_TableSet",
            "LanceTable", "AsyncTable", "LanceDBConnection", "AsyncConnection", "Session")
_baseline: list[tracemalloc.Snapshot] = []


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def malloc_mb() -> dict[str, float]:
    """glibc's heap (mallinfo2, glibc 2.33+): bytes in use and free in its arenas, and in mmap'd
    chunks, in MB; {} elsewhere. LanceDB's allocations are in it (see anon_mb); Python's small
    objects are not (its allocator maps arenas of its own)."""
    if not sys.platform.startswith("linux"):
        return {}
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    m = fn()
    mb = 2**20
    return {"arena_mb": round(m.arena / mb, 1), "in_use_mb": round(m.uordblks / mb, 1),
            "free_mb": round(m.fordblks / mb, 1), "mmap_mb": round(m.hblkhd / mb, 1),
            "top_free_mb": round(m.keepcost / mb, 1)}


_HEAP_ALIGN = 64 << 20  # a non-main arena's heaps are mappings aligned to 64 MB (HEAP_MAX_SIZE)
_PAGE = 4096


def _printed(write: Callable[[int], object]) -> str | None:
    """What `write(fp)` prints to a C stream (glibc's open_memstream), or None where there is
    no such stream (not Linux, no glibc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        memstream, fclose, free = libc.open_memstream, libc.fclose, libc.free
    except (OSError, AttributeError):
        return None
    memstream.restype = ctypes.c_void_p
    memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
    fclose.argtypes = [ctypes.c_void_p]
    free.argtypes = [ctypes.c_void_p]
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    fp = memstream(ctypes.byref(buf), ctypes.byref(size))
    if not fp:
        return None
    try:
        write(fp)
    finally:
        fclose(fp)
    try:
        return ctypes.string_at(buf, size.value).decode(errors="replace")
    finally:
        free(buf)


def malloc_arenas() -> dict[str, Any]:
    """glibc's malloc_info, per arena (glibc; {} elsewhere): each arena's system bytes, its free
    bytes (fast bins, bins and top chunk) and of those the bytes in free chunks smaller than a
    page, which stay resident after a trim (a trim hands back only whole free pages), in MB; and
    the resident MB of the non-main arenas' heaps (their 64 MB-aligned mappings), so the main
    arena's resident is anon_mb's "heap" and the others' is `heaps_rss_mb`."""
    try:
        info = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_info
    except (OSError, AttributeError):
        return {}
    info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    text = _printed(lambda fp: info(0, fp))
    if text is None:
        return {}
    return parse_malloc_info(text) | {"heaps_rss_mb": arena_heaps_rss_mb()}


def parse_malloc_info(text: str) -> dict[str, Any]:
    """malloc_info's XML as {"arenas": [{nr, system_mb, free_mb, small_free_mb, free_chunks}],
    "mmap_mb"}."""
    import xml.etree.ElementTree as ET

    mb = 2**20
    root = ET.fromstring(text)
    arenas: list[dict[str, Any]] = []
    for heap in root.findall("heap"):
        free = sum(int(t.get("size", 0)) for t in heap.findall("total")
                   if t.get("type") in ("fast", "rest"))
        chunks = sum(int(t.get("count", 0)) for t in heap.findall("total")
                     if t.get("type") in ("fast", "rest"))
        small = sum(int(s.get("total", 0)) for s in heap.iter("size")
                    if int(s.get("to", 0)) < _PAGE)
        system = next((int(s.get("size", 0)) for s in heap.findall("system")
                       if s.get("type") == "current"), 0)
        arenas.append({"nr": int(heap.get("nr", len(arenas))), "system_mb": round(system / mb, 1),
                       "free_mb": round(free / mb, 1), "small_free_mb": round(small / mb, 2),
                       "free_chunks": chunks})
    mmap = next((int(t.get("size", 0)) for t in root.findall("total")
                 if t.get("type") == "mmap"), 0)
    return {"arenas": arenas, "mmap_mb": round(mmap / mb, 1)}


def pymalloc_mb() -> dict[str, float]:
    """Python's small-object allocator (CPython's _PyObject_DebugMallocStats, the report
    sys._debugmallocstats prints, written to a memory stream; {} when not available), MB: its
    1 MB arenas, the bytes in allocated blocks, in free blocks of pools in use, and in unused
    pools. Arenas over allocated blocks is free space pymalloc keeps: an arena goes back only
    when every block in it is free. ~1 ms, under the GIL."""
    try:
        stats = ctypes.pythonapi._PyObject_DebugMallocStats
    except AttributeError:
        return {}
    stats.argtypes = [ctypes.c_void_p]
    stats.restype = ctypes.c_int
    used = [0]

    def write(fp: int) -> None:
        used[0] = stats(fp)

    text = _printed(write)
    if text is None:
        return {}
    return parse_pymalloc_stats(text) if used[0] else {}


def parse_pymalloc_stats(text: str) -> dict[str, float]:
    """The totals of _PyObject_DebugMallocStats's report, in MB (arena counts as counts)."""
    out: dict[str, float] = {}
    names = {"# arenas allocated current": "arenas", "# arenas highwater mark": "arenas_highwater",
             "# bytes in allocated blocks": "allocated_mb",
             "# bytes in available blocks": "available_mb", "unused pools": "unused_pools_mb",
             "arenas *": "arenas_mb"}
    for line in text.splitlines():
        head, _, value = line.rpartition("=")
        number = value.strip().replace(",", "")
        if not number.isdigit():
            continue
        for key, name in names.items():
            if key in head and name not in out:
                n = int(number)
                out[name] = n if name.startswith("arenas") and "mb" not in name else round(
                    n / 2**20, 1)
    return out


def arena_heaps_rss_mb(pid: int | None = None) -> float | None:
    """Resident MB of the anonymous read-write mappings that start on a 64 MB boundary: the
    heaps of glibc's non-main arenas (None: no /proc)."""
    try:
        text = Path(f"/proc/{pid or os.getpid()}/smaps").read_text()
    except OSError:
        return None
    total_kb = 0
    counting = False
    for line in text.splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo = int(head[0].split("-")[0], 16)
            counting = (len(head) == 5 and head[1].startswith("rw") and lo % _HEAP_ALIGN == 0)
        elif counting and line.startswith("Rss:"):
            total_kb += int(head[1])
    return round(total_kb / 1024, 1)


def smaps_mb(pid: int | None = None) -> dict[str, float]:
    """/proc/PID/smaps_rollup's fields in MB (Linux; {} elsewhere)."""
    try:
        text = Path(f"/proc/{pid or os.getpid()}/smaps_rollup").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[name.strip()] = round(int(parts[0]) / 1024, 1)
    return out


def anon_mb(pid: int | None = None) -> dict[str, float]:
    """Resident anonymous memory by where it lies (/proc/PID/smaps, Linux; {} elsewhere), MB:
    glibc's main arena ("[heap]"), the main thread's stack, and other anonymous mappings -
    glibc's other arena (64 MB reservations), Python's small-object arenas (1 MB each; the
    kernel merges neighbours into one mapping), the other threads' stacks and mimalloc's
    segments (pyarrow) - split by the mapping's size (up to 64 MB, larger). LanceDB 0.40
    allocates through glibc's malloc (its wheel links no allocator of its own; the jemalloc
    thread in a server is pyarrow's), so its memory is in the arenas."""
    try:
        text = Path(f"/proc/{pid or os.getpid()}/smaps").read_text()
    except OSError:
        return {}
    out: dict[str, float] = {}
    kind = None
    size_kb = 0
    for line in text.splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            size_kb = (hi - lo) >> 10
            name = head[5] if len(head) > 5 else ""
            if name == "[heap]":
                kind = "heap"
            elif name.startswith("[stack"):
                kind = "stack"
            elif not name:
                kind = "anon_le_64mb" if size_kb <= 65536 else "anon_gt_64mb"
            else:
                kind = None
        elif kind is not None and line.startswith("Rss:"):
            out[kind] = out.get(kind, 0.0) + int(head[1]) / 1024
    return {k: round(v, 1) for k, v in sorted(out.items())}


def cache_report(service: CanopyService) -> dict[str, Any]:
    """Bytes and entries of each of the service's caches."""
    views = service.view_cache
    evidence = service.caches.unit_evidence
    out: dict[str, Any] = {
        "views": {"bytes": views.memory_used, "budget": views.memory_bytes,
                  "entries": views.entries},
        "unit_evidence": {"bytes": evidence.size, "budget": evidence.max_bytes,
                          "entries": evidence.entries},
    }
    session = service.vectors.session
    if session is not None:
        out["lance_session"] = {"bytes": int(session.size_bytes),
                                "entries": int(session.approx_num_items)}
    return out


def watched_objects() -> dict[str, int]:
    """Live instances of the per-generation types (`_WATCHED`), by type name."""
    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in _WATCHED:
            counts[f"{type(obj).__module__}.{name}"] += 1
    return dict(sorted(counts.items()))


def objects_by_type(top: int = 40) -> dict[str, int]:
    counts = Counter(type(o).__name__ for o in gc.get_objects())
    return dict(counts.most_common(top))


def traced_growth(top: int = 30) -> list[dict[str, Any]] | None:
    """The lines whose traced allocations grew most since the first call (None: not tracing)."""
    if not tracemalloc.is_tracing():
        return None
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)])
    if not _baseline:
        _baseline.append(snap)
    diff = snap.compare_to(_baseline[0], "lineno")
    return [{"where": str(d.traceback[0]), "size_kb": round(d.size / 1024, 1),
             "growth_kb": round(d.size_diff / 1024, 1), "count_growth": d.count_diff}
            for d in diff[:top]]


def memory_report(service: CanopyService | None, *, objects: bool = False) -> dict[str, Any]:
    """The report GET /debug/memory answers (`service` None: not opened yet)."""
    report: dict[str, Any] = {"pid": os.getpid(), "threads": threading.active_count(),
                              "smaps_mb": smaps_mb(), "anon_mb": anon_mb(), "malloc": malloc_mb(),
                              "malloc_arenas": malloc_arenas(), "pymalloc": pymalloc_mb(),
                              "gc_counts": list(gc.get_count())}
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        report["pyarrow"] = {"allocated_bytes": int(pa.total_allocated_bytes()),
                             "pool": pa.default_memory_pool().backend_name}
    if service is not None:
        report["caches"] = cache_report(service)
        report["vector_sets"] = service.vectors.held_sets()
        if service.trimmer is not None:
            report["trims"] = {"count": service.trimmer.trims,
                               "seconds": round(service.trimmer.seconds, 3)}
    if objects:
        report["gc_tracked"] = len(gc.get_objects())
        report["watched"] = watched_objects()
        report["by_type"] = objects_by_type()
    if tracemalloc.is_tracing():  # no heap walk: PYTHONTRACEMALLOC asked for this alone
        report["traced_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
        report["traced_growth"] = traced_growth()
    return report


def mount_diagnostics(server: MCPServer, slot: ServiceSlot, host: str) -> bool:
    """Add GET /debug/memory to `server` when CANOPY_DIAGNOSTICS=1 and `host` is loopback;
    whether it was added."""
    if os.environ.get(DIAGNOSTICS_ENV) != "1" or host not in _LOOPBACK:
        return False
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    async def endpoint(request: Request) -> JSONResponse:
        try:
            service = slot.service
        except Exception:  # noqa: BLE001 - not opened yet: the process is reported alone
            service = None
        return JSONResponse(memory_report(service,
                                          objects=request.query_params.get("objects") == "1"))

    server.custom_route(DIAGNOSTICS_PATH, methods=["GET"], include_in_schema=False)(endpoint)
    return True

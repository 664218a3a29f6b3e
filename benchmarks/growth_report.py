"""Tables of growth_bench.py: figures per size, per-article fits, issue 14's targets.

Standard library only: growth_bench.py's driver imports it and must stay small. Besides the
driver's own output, `growth_bench.py --render A.json [B.json ...]` prints the tables again from
saved results, merging runs by corpus size (a `--only fake` run next to a main run, say).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

UPDATE_STEPS = ("add", "edit", "delete", "noop")
INDEX_STEPS = ("build", *UPDATE_STEPS, "fake")
STEP_LABELS = {"build": "full build", "add": "+1 article", "edit": "edit 1 paragraph",
               "delete": "delete 1 article", "noop": "no-op rerun", "fake": "full build, fake LLM"}
Row = dict[str, Any]


@dataclass(frozen=True)
class Figure:
    """One row of the figures table: `get` reads it from a size's row; `source` is the step
    (or "serve") whose status explains a missing value."""

    name: str
    unit: str
    get: Callable[[Row], float | None]
    source: str


def step_value(step: str, key: str) -> Callable[[Row], float | None]:
    def get(row: Row) -> float | None:
        r = row["steps"].get(step, {})
        if r.get("status") != "ok":
            return None
        if r.get("reused") and key != "text_units":  # a catch-up run, not a full build
            return None
        value = r.get("stats", {}).get(key) if key == "text_units" else r.get(key)
        return value if isinstance(value, int | float) else None
    return get


def serve_value(*path: str) -> Callable[[Row], float | None]:
    def get(row: Row) -> float | None:
        node: Any = row.get("serve", {})
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node if isinstance(node, int | float) and not isinstance(node, bool) else None
    return get


def _serve_figures() -> list[Figure]:
    one, many = ("concurrency", "1"), ("concurrency", "many")
    rows: list[tuple[str, str, tuple[str, ...]]] = [
        ("serve: start to handshake", "s", ("handshake_s",)),
        ("serve: first query (local_search) after handshake", "ms", ("first_query_ms",)),
        ("server RSS after first query", "MB", ("rss_after_first_mb",)),
        *[(f"{tool} {p}", "ms", ("tools", tool, f"{p}_ms"))
          for tool in ("local_search", "basic_search", "global_search")
          for p in ("first", "p50", "p95")
          if (tool, p) != ("local_search", "first")],  # that is the first query, above
        ("server RSS after the queries", "MB", ("rss_after_queries_mb",)),
        ("1 client: throughput", "calls/s", (*one, "calls_per_s")),
        ("1 client: p50", "ms", (*one, "p50_ms")),
        ("1 client: p95", "ms", (*one, "p95_ms")),
        ("N clients: throughput", "calls/s", (*many, "calls_per_s")),
        ("N clients: p50", "ms", (*many, "p50_ms")),
        ("N clients: p95", "ms", (*many, "p95_ms")),
        ("N clients: errors", "errors", (*many, "errors")),
        ("throughput N clients / 1 client", "x", ("concurrency", "ratio")),
        ("server RSS after concurrency", "MB", ("rss_after_concurrency_mb",)),
        ("server PSS after first query", "MB", ("pss_after_first_mb",)),
        ("server PSS after concurrency", "MB", ("pss_after_concurrency_mb",)),
        ("server peak RSS (VmHWM, main process)", "MB", ("server_hwm_mb",)),
    ]
    return [Figure(name, unit, serve_value(*path), "serve") for name, unit, path in rows]


FIGURES: list[Figure] = [
    Figure("text units", "units", step_value("build", "text_units"), "build"),
    *[Figure(f"{STEP_LABELS[s]}: {what}", unit, step_value(s, key), s)
      for s in INDEX_STEPS
      for what, unit, key in (("wall", "s", "wall_s"), ("peak memory", "MB", "peak_mb"))],
    *[Figure(f"{STEP_LABELS[s]}: background tidy after it", "s", step_value(s, "tidy_s"), s)
      for s in UPDATE_STEPS],
    Figure("full build, fake LLM: requests", "requests", step_value("fake", "fake_requests"),
           "fake"),
    *_serve_figures(),
]


# ---- fits and formatting -----------------------------------------------------------------------


def fit_slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of a figure over articles (None below two sizes)."""
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}"
    if unit == "ms" or abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def fmt_slope(slope: float | None, unit: str) -> str:
    """Growth per article, in a unit that keeps the digits readable."""
    if slope is None or unit == "x":
        return "-"
    if unit == "s" and abs(slope) < 0.01:
        return f"{slope * 1000:+.3g} ms/article"
    if unit == "ms" and abs(slope) < 0.01:
        return f"{slope * 1000:+.3g} µs/article"
    return f"{slope:+.3g} {unit}/article"


def missing(row: Row, source: str) -> str:
    """Why a figure has no value at this size: its step's status when that did not finish."""
    r = row.get("serve") if source == "serve" else row["steps"].get(source)
    status = str((r or {}).get("status", "-"))
    return status.split(" (")[0] if status != "ok" else "-"


def figures_table(rows: list[Row], clients: int) -> list[str]:
    sizes = [r["articles"] for r in rows]
    lines = ["| figure | " + " | ".join(f"{n:,} articles" for n in sizes)
             + " | least-squares slope | ratio between sizes |",
             "|" + "---|" * (len(sizes) + 3)]
    for f in FIGURES:
        values = [f.get(r) for r in rows]
        cells = [fmt(v, f.unit) if v is not None else missing(r, f.source)
                 for v, r in zip(values, rows, strict=True)]
        if all(c == "-" for c in cells):
            continue  # a phase this run did not measure
        points = [(float(n), float(v)) for n, v in zip(sizes, values, strict=True) if v is not None]
        ratios = [f"{b / a:.2f}x" if a and b is not None else "-"
                  for a, b in zip(values, values[1:], strict=False)]
        unit = "" if f.unit in ("x", "units", "errors", "requests") else f" ({f.unit})"
        name = f.name.replace("N clients", f"{clients} clients")
        lines.append(f"| {name}{unit} | " + " | ".join(cells)
                     + f" | {fmt_slope(fit_slope(points), f.unit)} | {', '.join(ratios) or '-'} |")
    growth = ", ".join(f"{b / a:.2f}x" for a, b in zip(sizes, sizes[1:], strict=False))
    lines += ["", f"Articles grow by {growth or '-'} between the sizes: a figure that grows by "
              "the same ratios grows linearly with the corpus."]
    return lines


# ---- targets -----------------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "NOT met")


def update_targets(at: Row | None, big: Row | None) -> list[tuple[str, str, str]]:
    """+1 / edit / delete: share of the full build at 1,827; under 10 s at 10k."""
    out: list[tuple[str, str, str]] = []
    build_wall = step_value("build", "wall_s")(at) if at else None
    build_peak = step_value("build", "peak_mb")(at) if at else None
    for step in ("add", "edit", "delete"):
        label = STEP_LABELS[step]
        wall = step_value(step, "wall_s")(at) if at else None
        peak = step_value(step, "peak_mb")(at) if at else None
        if wall is not None and build_wall:
            out.append((f"{label} at 1,827: wall <= 5% of full build's",
                        f"{fmt(wall, 's')} s = {100 * wall / build_wall:.1f}%",
                        verdict(wall <= 0.05 * build_wall)))
        else:
            out.append((f"{label} at 1,827: wall <= 5% of full build's", "-", verdict(None)))
        if peak is not None and build_peak:
            out.append((f"{label} at 1,827: peak <= half of full build's",
                        f"{fmt(peak, 'MB')} MB = {100 * peak / build_peak:.0f}%",
                        verdict(peak <= 0.5 * build_peak)))
        else:
            out.append((f"{label} at 1,827: peak <= half of full build's", "-", verdict(None)))
    for step in ("add", "edit", "delete"):
        wall = step_value(step, "wall_s")(big) if big else None
        out.append((f"{STEP_LABELS[step]} at 10k: < 10 s",
                    "-" if wall is None else f"{fmt(wall, 's')} s",
                    verdict(None if wall is None else wall < 10)))
    return out


def serve_targets(at: Row | None, big: Row | None) -> list[tuple[str, str, str]]:
    peak = step_value("build", "peak_mb")(at) if at else None
    rss = [v for v in (serve_value(k)(big) if big else None
                       for k in ("rss_after_first_mb", "rss_after_queries_mb",
                                 "rss_after_concurrency_mb")) if v is not None]
    first = serve_value("first_query_ms")(big) if big else None
    return [
        ("full-build peak at 1,827 <= 1 GB (1,024 MB)",
         "-" if peak is None else f"{fmt(peak, 'MB')} MB",
         verdict(None if peak is None else peak <= 1024)),
        ("server memory at 10k <= 1.5 GB (1,536 MB; largest RSS sampled)",
         f"{fmt(max(rss), 'MB')} MB" if rss else "-", verdict(max(rss) <= 1536 if rss else None)),
        ("first query at 10k < 1 s", "-" if first is None else f"{fmt(first, 'ms')} ms",
         verdict(None if first is None else first < 1000)),
    ]


def targets(rows: list[Row], clients: int) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for each of issue 14's targets this run can check."""
    by_n = {r["articles"]: r for r in rows}
    at = by_n.get(1827)
    big = by_n.get(max((n for n in by_n if n >= 10_000), default=-1))
    out = update_targets(at, big) + serve_targets(at, big)
    for n, row in by_n.items():
        ratio = serve_value("concurrency", "ratio")(row)
        errors = serve_value("concurrency", "many", "errors")(row)
        with_n = f"; measured with {clients} clients" if clients != 16 else ""
        out.append((f"16 clients >= 1.7x one client's calls/s, no errors ({n:,} articles{with_n})",
                    "-" if ratio is None else f"{ratio:.2f}x, {errors:.0f} errors",
                    verdict(None if ratio is None else ratio >= 1.7 and not errors)))
    return out


# ---- the whole report --------------------------------------------------------------------------


def load_cell(r: dict[str, Any] | None) -> str:
    if not r:
        return "-"
    load = "/".join(str(x) for x in r.get("loadavg_1m", []))
    status = str(r.get("status", "-")).split(" (")[0]  # "skipped (why)": the JSON says why
    return load if status == "ok" else f"{status} {load}".strip()


def header(m: dict[str, Any]) -> str:
    return (f"{m['date']}, {m['repo']} at {m['commit']}, Python {m['python']}, {m['cpus']} CPUs, "
            f"load average {m['loadavg_start']} at start, {m.get('loadavg_end', '-')} at end")


def notes(rows: list[Row], s: dict[str, Any]) -> list[str]:
    level = "dynamic" if s["global_level"] is None else f"fixed level {s['global_level']}"
    out = [f"global_search: {level} community selection. Queries: {s['queries']} DEV questions "
           f"for local and basic, {s['global_queries']} for global, after one first call each "
           f"(`first`), each tool capped at {s['tool_budget']:.0f} s. Concurrency: {s['clients']} "
           f"clients for {s['conc_seconds']:.0f} s vs one client for as long, mixing "
           f"local_search, basic_search and drill_down; server args: "
           f"`{s['serve_args'] or '(none)'}`."]
    for row in rows:
        for tool, t in row.get("serve", {}).get("tools", {}).items():
            wanted = s["global_queries"] if tool == "global_search" else s["queries"]
            if t.get("n", 0) < wanted:
                out.append(f"- {row['articles']:,} articles: {tool} measured {t.get('n')} of "
                           f"{wanted} questions within its budget.")
    return out


def render(report: dict[str, Any]) -> str:
    rows, s = report["rows"], report["settings"]
    machines = report.get("machines") or [report["machine"]]
    lines = ["## Canopy growth benchmark", ""]
    lines += [f"Run: {header(m)}" for m in machines] + [""]
    lines += figures_table(rows, s["clients"])
    lines += ["", "Issue 14's targets:", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {v} | {ok} |" for t, v, ok in targets(rows, s["clients"])]
    lines += ["", "Load average (1 min) before/after each step, with the step's status unless ok:",
              "", "| articles | " + " | ".join(STEP_LABELS[k] for k in INDEX_STEPS) + " | serve |",
              "|---|" + "---|" * (len(INDEX_STEPS) + 1)]
    for row in rows:
        cells = [load_cell(row["steps"].get(k)) for k in INDEX_STEPS]
        lines.append(f"| {row['articles']:,} | " + " | ".join([*cells, load_cell(row.get("serve"))])
                     + " |")
    return "\n".join([*lines, "", *notes(rows, s)])


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several runs: rows joined by size, later runs adding steps and serving."""
    by_n: dict[int, Row] = {}
    for rep in reports:
        for row in rep["rows"]:
            into = by_n.setdefault(row["articles"], {"articles": row["articles"], "steps": {}})
            into["steps"].update(row["steps"])
            if "serve" in row:
                into["serve"] = row["serve"]
    serving = [r for r in reports if any("serve" in row for row in r["rows"])]
    return {"machines": [r["machine"] for r in reports],
            "settings": (serving or reports)[0]["settings"],
            "rows": [by_n[n] for n in sorted(by_n)]}

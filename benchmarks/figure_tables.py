"""The tables of figures the docs show, each computed from results files in benchmarks/results.

A renderer takes the results folder and returns a Table: its header, its rows, and the run
behind it (file, commit, command). `table_for(NAME)` is one of RENDERERS, or `STEM/TABLE` for a
table transcribed into `STEM.json` from where its figures were first recorded. A results file
that names no commit or no command backs no table. benchmarks/render_tables.py writes them into
the docs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Run:
    """Where a table's figures come from: the results file, and the run that wrote it."""

    source: str  # path of the results file, relative to the repository
    commit: str
    command: str
    note: str = ""  # load, machine, what the file itself does not say


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    runs: tuple[Run, ...]


def _load(results: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((results / name).read_text(encoding="utf-8"))
    return data


def _source(name: str) -> str:
    """The file as the docs name it: benchmarks/results/NAME (the tests render from a copy)."""
    return f"benchmarks/results/{name}"


def _run(results: Path, name: str, data: dict[str, Any], note: str = "") -> Run:
    """The commit and command a results file names (at the top, or in its `machine`)."""
    commit = data.get("commit") or data.get("machine", {}).get("commit")
    command = data.get("command")
    if not commit or not command:
        raise ValueError(f"{name} names no commit or no command: it cannot back a table")
    return Run(_source(name), str(commit), str(command),
               note or str(data.get("note") or data.get("load") or ""))


def _three(scores: dict[str, float]) -> str:
    return " / ".join(f"{scores[k]:.3f}" for k in ("2", "5", "10"))


# ---- tables computed from a benchmark's own results -------------------------------------------

RETRIEVAL_SETS = (
    ("multihop-rag", "MultiHop-RAG, 609 articles `# {title}` and the body"),
    ("multihop-rag-fm", "MultiHop-RAG, the same with YAML front matter"),
    ("musique", "MuSiQue sample, 1,890 paragraphs `# {title}`"),
)


def retrieval_eval(results: Path) -> Table:
    """R@2 / R@5 / R@10 of the tools as delivered, BM25 beside them, and the bridge gold."""
    data = _load(results, "retrieval_eval.json")["datasets"]
    rows, runs = [], []
    for key, label in RETRIEVAL_SETS:
        entry = data[key]
        by_tool = {s["tool"]: s for s in entry["scores"]}
        rows.append((f"{label} ({entry['questions']:,})",
                     _three(by_tool["local"]["recall"]), _three(by_tool["basic"]["recall"]),
                     _three(by_tool["bm25"]["recall"]), _three(by_tool["local"]["bridge_recall"]),
                     _three(by_tool["bm25"]["bridge_recall"])))
        runs.append(Run(_source("retrieval_eval.json"), entry["commit"], entry["command"],
                        f"{entry['machine']}, {entry['provider']} provider, {entry['embedder']}"))
    header = ("data set (DEV questions)", "local_search, delivered", "basic_search, delivered",
              "BM25", "local, bridge gold", "BM25, bridge gold")
    return Table(header, tuple(rows), tuple(runs))


def delivered(results: Path) -> Table:
    """What a result of retrieval_eval's runs delivered: documents cited and tokens (medians
    over questions) within `[query] result_token_limit`, and the share of results cut to fit."""
    data = _load(results, "retrieval_eval.json")["datasets"]
    rows, runs = [], []
    for key, label in RETRIEVAL_SETS:
        entry = data[key]
        by_tool = {s["tool"]: s for s in entry["scores"]}
        cells = []
        for tool in ("local", "basic"):
            score = by_tool[tool]
            cells += [f"{score['median_documents']:.0f} / {score['median_tokens']:,.0f}",
                      f"{100 * score['truncated']:.1f}%"]
        rows.append((f"{label} ({entry['questions']:,})", f"{entry['result_token_limit']:,}",
                     *cells))
        runs.append(Run(_source("retrieval_eval.json"), entry["commit"], entry["command"],
                        f"{entry['machine']}, {entry['provider']} provider, {entry['embedder']}"))
    header = ("data set (DEV questions)", "result_token_limit",
              "local_search: documents cited / tokens (medians)", "local_search: cut to fit",
              "basic_search: documents cited / tokens (medians)", "basic_search: cut to fit")
    return Table(header, tuple(rows), tuple(runs))


ROUTER_FILE = "router_eval_1a596b2.json"
ROUTER_SETS = (
    ("multihop-rag", "MultiHop-RAG, 609 articles"),
    ("podcast", "podcast transcripts, 1,669 files"),
    ("earnings", "earnings calls, multi-transcript, 41 files"),
)


def _routed(entry: dict[str, Any]) -> str:
    routed = entry["routed"]
    return " / ".join(f"{routed[k]:,}" for k in ("basic", "local", "global"))


def router_eval(results: Path) -> Table:
    """Where the `search` router sends the DEV questions of the sets its rules came from."""
    data = _load(results, ROUTER_FILE)
    rows = []
    totals: dict[tuple[str, str], dict[str, int]] = {}
    for key, label in ROUTER_SETS:
        offline, fake = data["sets"][key]["offline"], data["sets"][key]["fake-llm"]
        (gold,) = offline["labels"]
        rows.append((f"{label} ({offline['questions']:,})", gold, _routed(offline),
                     f"{offline['accuracy']:.3f}", _routed(fake), f"{fake['accuracy']:.4f}"))
        for mode, entry in (("offline", offline), ("fake", fake)):
            total = totals.setdefault((mode, gold), {"basic": 0, "local": 0, "global": 0})
            for engine, n in entry["routed"].items():
                total[engine] += n

    def pooled(mode: str) -> tuple[str, str]:
        both = [totals[(mode, gold)] for gold in ("global", "not global")]
        right = (both[0]["global"] / sum(both[0].values()),
                 1 - both[1]["global"] / sum(both[1].values()))
        digits = 3 if mode == "offline" else 4
        return (" and ".join(_routed({"routed": t}) for t in both),
                " / ".join(f"{r:.{digits}f}" for r in right))

    rows.append(("all scored, global row / not-global row", "", *pooled("offline"),
                 *pooled("fake")))
    header = ("data set (DEV questions)", "label", "offline rules: to basic / local / global",
              "accuracy", "fake LLM: to basic / local / global", "accuracy")
    return Table(header, tuple(rows), (_run(results, ROUTER_FILE, data),))


def router_held_out(results: Path) -> Table:
    """The offline rules on the hand-labelled sets they were not written from."""
    data = _load(results, ROUTER_FILE)
    rows = []
    questions = right = right_global = 0
    by_label: dict[str, list[int]] = {"global": [0, 0], "local": [0, 0], "basic": [0, 0]}
    for key, entry in data["sets"].items():
        offline = entry["offline"]
        if not offline["group"].startswith("held out"):
            continue
        n = offline["questions"]
        correct = round(offline["accuracy"] * n)
        questions, right = questions + n, right + correct
        right_global += round(offline["global_vs_rest"] * n)
        per_label = []
        for label in by_label:
            count = offline["labels"].get(label, 0)
            hit = offline["confusion"].get(label, {}).get(label, 0)
            by_label[label][0] += hit
            by_label[label][1] += count
            per_label.append(f"{hit} / {count}")
        rows.append((key, f"{correct} / {n}", f"{offline['accuracy']:.3f}",
                     f"{offline['global_vs_rest']:.3f}", *per_label))
    rows.append(("all held out", f"{right} / {questions}", f"{right / questions:.3f}",
                 f"{right_global / questions:.3f}",
                 *(f"{hit} / {count}" for hit, count in by_label.values())))
    header = ("held-out set (DEV questions, labelled by hand)", "to the labelled engine",
              "accuracy", "global against the rest", "labelled global, routed there",
              "labelled local, routed there", "labelled basic, routed there")
    return Table(header, tuple(rows), (_run(results, ROUTER_FILE, data),))


EMBED_FILE = "embed_eval.json"


def embed_eval(results: Path) -> Table:
    """Hashed against WordLlama vectors, on the tools' rankings before their results were
    assembled (what `canopy eval` scored before it scored results as delivered)."""
    data = _load(results, EMBED_FILE)
    rows = []
    for dataset, label in (("multihop-rag", "MultiHop-RAG"), ("musique", "MuSiQue")):
        per = data["results"][dataset]
        hashed, llama = per["hash"]["eval"]["tools"], per["wordllama"]["eval"]["tools"]

        def three(tools: dict[str, Any], tool: str) -> str:
            return " / ".join(f"{tools[tool][f'R@{k}']:.3f}" for k in (2, 5, 10))

        for tool, name in (("local", "local_search"), ("basic", "basic_search"),
                           ("vector", "vectors alone"), ("bm25", "BM25")):
            full = f"{tool}:full-weight"
            rows.append((f"{label}, {name}", three(hashed, tool), three(llama, tool),
                         three(llama, full) if full in llama else ""))
    header = ("dataset, ranking", "hash", "wordllama", "wordllama fused at full weight")
    return Table(header, tuple(rows), (_run(results, EMBED_FILE, data),))


def embed_cost(results: Path) -> Table:
    """What WordLlama costs beside hashing, in the same runs as embed_eval: CPU to load the model
    and embed the texts, the whole build's CPU and peak memory, and the tools' query CPU."""
    data = _load(results, EMBED_FILE)
    rows = []
    for dataset, label in (("multihop-rag", "MultiHop-RAG"), ("musique", "MuSiQue")):
        texts = data["throughput"][dataset]
        for embedder in ("hash", "wordllama"):
            cost, run = texts[embedder], data["results"][dataset][embedder]
            build, tools = run["build"], run["eval"]["tools"]
            query = " / ".join(f"{tools[t]['cpu_p50_ms']:.1f}" for t in ("local", "basic"))
            rows.append((f"{label} ({texts['texts']:,} texts, {texts['mb']} MB), {embedder}",
                         f"{cost['load_cpu_s']:.2f}", f"{cost['embed_cpu_s']:.2f}",
                         f"{build['cpu_s']:.1f}", f"{build['peak_mb']:.0f}", query))
    header = ("dataset, embedder", "model load, CPU s", "embedding, CPU s", "whole build, CPU s",
              "build peak MB", "query CPU p50 ms, local_search / basic_search")
    return Table(header, tuple(rows), (_run(results, EMBED_FILE, data),))


ALIAS_FILE = "alias_eval.json"
ALIAS_CORPORA = (
    ("multihop", "MultiHop-RAG, 609 articles"),
    ("musique", "MuSiQue sample, 1,890 paragraphs"),
    ("carol", "A Christmas Carol"),
    ("medical", "GraphRAG-Bench's medical guides"),
)


def alias_eval(results: Path) -> Table:
    """Entity resolution on the hand-labelled pairs: merge precision and recall per corpus and
    pooled, and each corpus's entities by normalized name alone and after merging."""
    data = _load(results, ALIAS_FILE)
    rows = []
    for key, label in ALIAS_CORPORA:
        entry = data["corpora"][key]
        rows.append((label, f"{entry['true_pairs']} / {entry['false_pairs']}",
                     f"{entry['merged']}", f"{entry['precision']:.3f}", f"{entry['recall']:.3f}",
                     f"{entry['entities_by_normalized_name']:,} -> {entry['entities']:,}"))
    pooled = data["all"]
    rows.append(("all pairs", f"{pooled['true_pairs']} / {pooled['false_pairs']}",
                 f"{pooled['merged']}", f"{pooled['precision']:.3f}", f"{pooled['recall']:.3f}",
                 ""))
    header = ("corpus (builtin provider)", "pairs naming one entity / two", "pairs merged",
              "precision", "recall", "entities: by normalized name alone -> after merging")
    machine = data["machine"]
    return Table(header, tuple(rows), (_run(results, ALIAS_FILE, data,
                                            f"{machine['cpus']} cores"),))


GROWTH_10K = "growth_10k_bc304a3.json"
GROWTH_1827 = "growth_1827_bc304a3.json"


def _growth(results: Path, name: str) -> tuple[dict[str, Any], Run]:
    data = _load(results, name)
    loads = [*data["machine"]["loadavg_start"][:1], *data["machine"]["loadavg_end"][:1]]
    for row in data["rows"]:
        for step in (*row["steps"].values(), row.get("serve") or {}):
            loads += step.get("loadavg_1m", [])
    return data, _run(results, name, data, f"load {min(loads):.1f}-{max(loads):.1f}")


def _s(value: float) -> str:
    return f"{value:.2f} s"


def figures(results: Path) -> Table:
    """README's short table: retrieval, routing, and what an update and a build cost."""
    retrieval = _load(results, "retrieval_eval.json")["datasets"]
    router = _load(results, ROUTER_FILE)
    g10, run10 = _growth(results, GROWTH_10K)
    g1827, run1827 = _growth(results, GROWTH_1827)
    rows: list[tuple[str, ...]] = []
    for key, label in (("multihop-rag", "MultiHop-RAG"), ("musique", "MuSiQue")):
        by_tool = {s["tool"]: s for s in retrieval[key]["scores"]}
        rows.append((f"R@10 as delivered, {label} DEV ({retrieval[key]['questions']:,} questions): "
                     "local_search / basic_search / BM25",
                     " / ".join(f"{by_tool[t]['recall']['10']:.3f}"
                                for t in ("local", "basic", "bm25"))))
    held = [s["offline"] for s in router["sets"].values()
            if s["offline"]["group"].startswith("held out")]
    right = sum(round(s["accuracy"] * s["questions"]) for s in held)
    total = sum(s["questions"] for s in held)
    rows.append(("`search` routing to the hand-labelled engine, held-out DEV questions, "
                 "offline rules", f"{right / total:.3f}"))
    steps10 = g10["rows"][0]["steps"]
    rows.append(("one update at 10,000 articles: +1 article / edit / delete",
                 " / ".join(_s(steps10[k]["wall_s"]) for k in ("add", "edit", "delete"))))
    rows.append(("peak memory of those updates",
                 f"{max(steps10[k]['peak_mb'] for k in ('add', 'edit', 'delete')):.0f} MB"))
    conc = g10["rows"][0]["serve"]["concurrency"]
    rows.append(("16 clients at 10,000 articles, `--workers 2`: calls/s against one client's",
                 f"{conc['many']['calls_per_s'] / conc['1']['calls_per_s']:.2f}x"))
    build = g1827["rows"][0]["steps"]["build"]
    rows.append(("full build of 1,827 articles, builtin provider: wall / peak memory",
                 f"{build['wall_s']:.0f} s / {build['peak_mb']:.0f} MB"))
    header = ("measure", "figure")
    runs = tuple(
        Run(_source("retrieval_eval.json"), e["commit"], e["command"], e["machine"])
        for e in (retrieval["multihop-rag"],))
    musique = retrieval["musique"]
    if (musique["commit"], musique["command"]) != (runs[0].commit, runs[0].command):
        runs += (Run(_source("retrieval_eval.json"), musique["commit"],
                     musique["command"], musique["machine"]),)
    return Table(header, tuple(rows), (*runs, _run(results, ROUTER_FILE, router), run10, run1827))


STEPS = (("build", "full build"), ("add", "+1 article"), ("edit", "edit one article"),
         ("delete", "delete one article"), ("noop", "no change"))


def growth(results: Path) -> Table:
    """What a build and each kind of update cost at 1,827 and 10,000 articles (one commit)."""
    rows: list[tuple[str, ...]] = []
    runs = []
    for name in (GROWTH_1827, GROWTH_10K):
        data, run = _growth(results, name)
        runs.append(run)
        for row in data["rows"]:
            steps = row["steps"]
            build = steps.get("build", {})
            full = None if build.get("reused") else build.get("wall_s")
            for key, label in STEPS:
                step = steps.get(key)
                if step is None or (key == "build" and full is None):
                    continue
                share = f"{100 * step['wall_s'] / full:.1f}%" if full and key != "build" else ""
                rows.append((f"{row['articles']:,}", label, _s(step["wall_s"]),
                             f"{step['peak_mb']:.0f} MB", share))
    header = ("articles", "step", "wall", "peak memory", "share of the full build")
    return Table(header, tuple(rows), tuple(runs))


def serving(results: Path) -> Table:
    """One server (`--workers 2`) at 10,000 articles: first answer, latencies, 16 clients."""
    data, run = _growth(results, GROWTH_10K)
    serve = data["rows"][0]["serve"]
    tools, conc = serve["tools"], serve["concurrency"]
    rows = [("handshake, then the first query", f"{serve['handshake_s']:.1f} s, then "
             f"{serve['first_query_ms']:.0f} ms")]
    rows += [(f"{tool} p50 / p95 ({tools[tool]['n']} queries)",
              f"{tools[tool]['p50_ms']:.0f} ms / {tools[tool]['p95_ms']:.0f} ms")
             for tool in ("local_search", "basic_search", "global_search")]
    rows.append(("calls/s, 1 client / 16 clients (local, basic, drill_down mixed)",
                 f"{conc['1']['calls_per_s']:.2f} / {conc['many']['calls_per_s']:.2f}"))
    errors = conc["1"]["errors"] + conc["many"]["errors"]
    rows.append(("errors under 16 clients", f"{errors}"))
    rows.append(("server memory after 16 clients, RSS / PSS",
                 f"{serve['rss_after_concurrency_mb']:,.0f} MB / "
                 f"{serve['pss_after_concurrency_mb']:,.0f} MB"))
    return Table(("measure", "figure"), tuple(rows), (run,))


SOAKS = (
    ("soak_20min_arenas.json",
     "20 minutes, an edit every 20 s, an addition every 60 s, a deletion every 120 s"),
    ("soak_issue30_c.json", "c: 10 minutes, the same plus a probe edited every 3 s"),
    ("soak_issue30_d.json", "d: the same (one sample counted a fork of the server twice: "
                            "benchmarks/README.md has its slope without it)"),
    ("soak_issue30_e.json", "e: the same"),
    ("soak_issue30_main_b32f8d5.json", "main alone: the same"),
    ("soak_issue30_cache64.json", "e's code with `[query] cache_mb = 64`: the same"),
    ("soak_issue30_default_7e162fb.json", "7e162fb, another machine: the same"),
    ("soak_issue30_steady_bcf9664.json", "bcf9664: the same with `--steady` (the corpus holds "
                                         "its size: 10 additions, 9 deletions)"),
    ("soak_issue30_steady_d1bc7f7.json", "d1bc7f7 (name keys memoized only during a build): "
                                         "the same with `--steady`"),
    ("soak_issue30_base_e798efb.json", "e798efb: the same with `--steady`"),
    ("soak_issue30_limit2.json", "84b5f99 (LanceDB queries bounded at two in flight): the "
                                 "same with `--steady`"),
    ("soak_issue30_limit2_trim.json", "fc81439 (that, and a trim every 2 s while calls are "
                                      "served): the same with `--steady`"),
    ("soak_issue30_base_default_e798efb.json", "e798efb: the default schedule"),
    ("soak_issue30_final_trim.json", "675a6b0 (the trim alone): the default schedule"),
    ("soak_issue30_final_trim_2.json", "63083d1 (the same code): the default schedule again"),
)


def _soak_run(results: Path, name: str, data: dict[str, Any]) -> Run:
    machine = data["machine"]
    return _run(results, name, data, f"load {machine['loadavg_start'][0]:.1f} at the start, "
                                     f"{machine['loadavg_end'][0]:.1f} at the end")


def soak(results: Path) -> Table:
    """`serve --watch` under 16 clients and updates: RSS by minute, and its slope at the end."""
    rows, runs = [], []
    for name, label in SOAKS:
        data = _load(results, name)
        summary = data["summary"]
        minutes = {m["minute"]: m["rss_mb"] for m in summary["rss_per_minute"]}
        marks = [m for m in (1, 5, 10, 15, 20) if m in minutes]
        rows.append((label, ", ".join(f"{minutes[m]:.0f} ({m})" for m in marks),
                     f"{summary['slope_second_half_mb_per_min']:.1f}",
                     f"{summary['slope_last_5_min_mb_per_min']:.1f}"
                     if "slope_last_5_min_mb_per_min" in summary else "",
                     f"{summary['updates_applied']}", f"{summary['calls']:,}, {summary['errors']}"))
        runs.append(_soak_run(results, name, data))
    header = ("run (100 articles, 16 clients)", "RSS MB at the end of minute (n)",
              "slope, second half, MB/min", "slope, last 5 minutes, MB/min", "updates",
              "calls, errors")
    return Table(header, tuple(rows), tuple(runs))


SOAK_DIAGNOSTICS = (
    ("soak_issue30_default_7e162fb.json", "7e162fb, the default schedule"),
    ("soak_issue30_steady_bcf9664.json", "bcf9664, `--steady`"),
    ("soak_issue30_steady_d1bc7f7.json", "d1bc7f7 (name keys memoized only during a build), "
                                         "`--steady`"),
    ("soak_issue30_base_e798efb.json", "e798efb, `--steady`"),
    ("soak_issue30_limit2.json", "84b5f99 (LanceDB queries bounded at two), `--steady`"),
    ("soak_issue30_limit2_trim.json", "fc81439 (that, and a trim every 2 s under calls), "
                                      "`--steady`"),
    ("soak_issue30_base_default_e798efb.json", "e798efb, the default schedule"),
    ("soak_issue30_final_trim.json", "675a6b0 (the trim alone), the default schedule"),
    ("soak_issue30_final_trim_2.json", "63083d1 (the same code), the default schedule again"),
)
SOAK_CACHES = ("lance_session_mb", "unit_evidence_mb", "views_mb")


def soak_diagnostics(results: Path) -> Table:
    """The soaks run with `--diagnostics`: RSS's slope over the last five minutes with its
    standard error, and the slopes of what the server reports of itself over the same minutes."""
    rows, runs = [], []
    for name, label in SOAK_DIAGNOSTICS:
        data = _load(results, name)
        summary = data["summary"]
        parts = summary["diagnostics_slopes_last_5_min_mb_per_min"]
        rows.append((label, f"{summary['slope_last_5_min_mb_per_min']:.2f} ± "
                            f"{summary['slope_last_5_min_se_mb_per_min']:.2f}",
                     f"{parts['glibc_in_use_mb']:.2f}", f"{parts['anonymous_mb']:.2f}",
                     " / ".join(f"{parts[c]:.2f}" for c in SOAK_CACHES)))
        runs.append(_soak_run(results, name, data))
    header = ("run (100 articles, 16 clients, a probe edited every 3 s)",
              "RSS, last 5 minutes, MB/min (± standard error)", "glibc's heap in use, MB/min",
              "anonymous RSS, MB/min", "caches: LanceDB session / unit evidence / views, MB/min")
    return Table(header, tuple(rows), tuple(runs))


RAY_FILE = "ray_bench.json"


def ray_bench(results: Path) -> Table:
    """`canopy index --ray local` with one and two workers, beside a local build, one run."""
    data = _load(results, RAY_FILE)
    by = {row["setup"]: row for row in data["rows"]}
    setups = (("llm-local", "llm-ray1", "llm-ray2"), ("builtin-local", "builtin-ray1",
                                                      "builtin-ray2"))
    missing = [s for group in setups for s in group if s not in by]
    if missing:
        raise ValueError(f"{RAY_FILE} has no rows {missing}")

    def ray_cpu(row: dict[str, Any]) -> str:
        if row["workers"] == 0:
            return f"{row['writer_cpu_s']:.1f} / -"
        start = row["ray_cpu_start_s"]
        return f"{row['writer_cpu_s']:.1f} / {start:.1f} + {row['ray_cpu_s'] - start:.1f}"

    llm, builtin = ([by[s] for s in group] for group in setups)
    requests = llm[0]["server"]["requests"]
    rows = [
        (f"{data['articles']} articles, fake LLM at {data['latency_s'] * 1000:.0f} ms "
         f"({requests:,} requests): wall s", *(f"{r['wall_s']:.1f}" for r in llm)),
        ("requests in flight, client mean / server mean",
         *(f"{r['stats']['llm_concurrency']['mean_in_flight']:.1f} / {r['server']['mean']:.1f}"
           for r in llm)),
        ("writer CPU s / Ray's processes' CPU s (start-up + build)", *map(ray_cpu, llm)),
        ("Ray's overhead a request, during the build / at rest (no-op actor call)", "-",
         *(f"{r['stats']['ray']['overhead_ms_per_call']:.0f} / {r['idle_ms']['actor_call']:.1f} ms"
           for r in llm[1:])),
        (f"{data['builtin_articles']} articles, builtin provider: wall s (extract stage s)",
         *(f"{r['wall_s']:.1f} ({r['stats']['seconds']['extract']:.1f})" for r in builtin)),
        ("writer CPU s / Ray's processes' CPU s", *map(ray_cpu, builtin)),
    ]
    header = ("build", "local", "Ray, 1 worker", "Ray, 2 workers")
    return Table(header, tuple(rows), (_ray_run(results, data),))


def _ray_run(results: Path, data: dict[str, Any]) -> Run:
    """The run, with the load averages its rows and its sweep recorded."""
    loads = [row[k] for row in data["rows"] for k in ("loadavg_before", "loadavg_after")]
    loads += [point["loadavg"] for point in data.get("sweep", [])]
    return _run(results, RAY_FILE, data, f"{data['machine']['cpus']} cores, "
                                         f"load {min(loads):.1f}-{max(loads):.1f}")


def ray_sweep(results: Path) -> Table:
    """Ray's overhead a request against the requests in flight (ray_bench.py's `sweep`: no
    build, the same number of requests at each point)."""
    data = _load(results, RAY_FILE)
    points = {(p["workers"], p["in_flight"]): p for p in data["sweep"]}
    if not points:
        raise ValueError(f"{RAY_FILE} has no sweep")
    rows = []
    for in_flight in sorted({k for _, k in points}):
        cells = []
        for workers in (1, 2):
            point = points[(workers, in_flight)]
            cells.append(f"{point['overhead_ms']:.1f} / {point['writer_wait_ms']:.2f}")
        rows.append((f"{in_flight}", *cells))
    requests = sorted({p["requests"] for p in data["sweep"]})
    header = (f"requests in flight ({', '.join(map(str, requests))} requests a point)",
              "Ray, 1 worker: overhead / writer's wait, ms a request",
              "Ray, 2 workers: overhead / writer's wait, ms a request")
    return Table(header, tuple(rows), (_ray_run(results, data),))


def transcribed(results: Path, stem: str, table: str) -> Table:
    """A table kept as its figures were first recorded (`transcribed_from` says where)."""
    name = f"{stem}.json"
    data = _load(results, name)
    if not data.get("transcribed_from"):
        raise ValueError(f"{name} says nowhere where its figures were recorded")
    entry = data["tables"][table]
    run = _run(results, name, {**data, **{k: entry[k] for k in ("commit", "command", "load")
                                          if k in entry}})
    note = "; ".join(x for x in (run.note, f"transcribed from {data['transcribed_from']}") if x)
    return Table(tuple(entry["header"]), tuple(tuple(r) for r in entry["rows"]),
                 (Run(run.source, run.commit, run.command, note),))


SUITE_FILE = "suite_time.json"


def _suite_cell(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "not run"
    summary = entry["summary"] or f"exit code {entry['exit_code']}"
    workers = entry["workers"]
    return (f"{entry['wall_s']:,.0f} s wall, {workers} "
            f"{'process' if workers == 1 else 'workers'}: {summary}")


def suite_time(results: Path) -> Table:
    """The two test commands as .ci/run runs them, timed around the process (suite_time.py)."""
    data = _load(results, SUITE_FILE)
    before, after = data["load_before"][0], data["load_after"][0]
    run = _run(results, SUITE_FILE, data, f"{data['machine']['cpus']} cores, load "
                                          f"{before:.1f} before, {after:.1f} after")
    rows = (("`python -m pytest` (default)", _suite_cell(data.get("default"))),
            ("`python -m pytest -m heavy`", _suite_cell(data.get("heavy"))))
    return Table(("command", "measured"), rows, (run,))


def install_sizes(results: Path) -> Table:
    """What the heavy libraries weigh installed, and a fresh venv of the [test] extra."""
    data = _load(results, SUITE_FILE)
    rows = [(name, "not installed" if mb is None else f"{mb:,.1f} MB")
            for name, mb in data["sizes_mb"].items()]
    if "venv" in data:
        rows.append(("a fresh venv with `.[test]` (everything)", f"{data['venv']['mb']:,.0f} MB"))
    return Table(("distribution", "installed"), tuple(rows), (_run(results, SUITE_FILE, data),))


RENDERERS: dict[str, Callable[[Path], Table]] = {
    "figures": figures,
    "growth": growth,
    "serving": serving,
    "soak": soak,
    "retrieval_eval": retrieval_eval,
    "router_eval": router_eval,
    "router_held_out": router_held_out,
    "embed_eval": embed_eval,
    "embed_cost": embed_cost,
    "delivered": delivered,
    "soak_diagnostics": soak_diagnostics,
    "ray_bench": ray_bench,
    "ray_sweep": ray_sweep,
    "suite_time": suite_time,
    "install_sizes": install_sizes,
    "alias_eval": alias_eval,
}


def table_for(name: str, results: Path = RESULTS) -> Table:
    if "/" in name:
        stem, table = name.split("/", 1)
        return transcribed(results, stem, table)
    if name not in RENDERERS:
        raise KeyError(f"no table named {name!r} (known: {', '.join(sorted(RENDERERS))}, "
                       "or STEM/TABLE of a transcribed results file)")
    return RENDERERS[name](results)

"""Render the figure tables of README.md and docs/*.md from benchmarks/results/*.json.

Each table of figures in the documentation sits in a marked block:

    <!-- table: retrieval_eval -->
    ...what this script writes: the table, then the commit and command of each run behind it...
    <!-- /table -->

`NAME` is one of benchmarks/figure_tables.py's RENDERERS (a table computed from a benchmark's
own results file), or `STEM/TABLE` for a table transcribed into `benchmarks/results/STEM.json`
from where its figures were first recorded (the file's `transcribed_from` says where; its
`tables` hold the rows).
Every results file a table is rendered from names the commit and the command of its run; a
figure whose run was never recorded has no results file and so no place in the docs.

    python benchmarks/render_tables.py           # rewrite the blocks of README.md and docs/*.md
    python benchmarks/render_tables.py --check   # exit 1 naming the blocks that differ

tests/test_rendered_tables.py re-renders every block in memory and fails when one differs from
its JSON, when a table of figures stands outside a block, or when a sentence outside a block
writes a measured figure (`prose_figures`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.figure_tables import RESULTS, Run, Table, table_for

__all__ = ["PROSE_FIGURE", "RESULTS", "blocks", "figure_tables_outside_blocks", "is_figure",
           "markdown", "pages", "prose", "prose_figures", "rendered", "stale_blocks", "table_for"]


BLOCK = re.compile(r"^<!-- table: (?P<name>[\w./-]+) -->\n(?P<body>.*?)^<!-- /table -->$",
                   re.MULTILINE | re.DOTALL)


def pages(repo: Path = REPO) -> list[Path]:
    """The documentation a newcomer reads: README.md and every page of docs/."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def markdown(table: Table) -> str:
    """The table, then one line per run saying the file, commit and command behind it."""
    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [line(table.header), "|" + "---|" * len(table.header)]
    lines += [line(row) for row in table.rows]
    seen: list[Run] = []
    for run in table.runs:
        if run not in seen:
            seen.append(run)
    lines.append("")
    for number, run in enumerate(seen, 1):
        note = f"; {run.note}" if run.note else ""
        more = "<br>" if number < len(seen) else ""  # one line each where markdown joins lines
        lines.append(f"<sub>From `{run.source}`: commit {run.commit}, `{run.command}`{note}."
                     f"</sub>{more}")
    return "\n".join(lines) + "\n"


def blocks(text: str) -> Iterator[re.Match[str]]:
    return BLOCK.finditer(text)


def rendered(text: str, results: Path = RESULTS) -> str:
    """The page with every marked block rewritten from its results file."""
    return BLOCK.sub(lambda m: (f"<!-- table: {m['name']} -->\n"
                                f"{markdown(table_for(m['name'], results))}<!-- /table -->"),
                     text)


def stale_blocks(text: str, results: Path = RESULTS) -> list[str]:
    """Names of the blocks whose text is not what their results file renders."""
    return [m["name"] for m in blocks(text)
            if m["body"] != markdown(table_for(m["name"], results))]


# ---- tables of figures that no block renders ----------------------------------------------

# A figure: a number, with or without its unit, or several joined by separators ("0.556 / 0.775",
# "3.40 s / 2.51 s", "348 -> 407; 0.13", "1.81x"), bold and parenthesised notes aside. A table
# is a table of figures when a cell of its body is a figure, or when its header names a measure
# (figure, value, recall, accuracy, latency, a unit...) and a cell of its body holds a number
# outside code. Names, code, settings and prose are not figures.
_NUMBER = r"[~≈<>+-]?\d[\d,]*(?:\.\d+)?\s*(?:%|x|s|ms|min|h|MB|GB|TB|kB|KB|MiB|KiB|k|M|calls/s)?"
FIGURE = re.compile(rf"^{_NUMBER}(?:\s*(?:/|->|→|;|,|\+|-|–|to|of|against)\s*{_NUMBER})*$")


MEASURE = re.compile(r"\b(?:figures?|values?|measured|recall|R@\d+|accuracy|latency|p50|wall|peak|"
                     r"throughput|cost|MB|GB|ms|calls/s|tokens)\b", re.IGNORECASE)


def is_figure(cell: str) -> bool:
    text = re.sub(r"\([^)]*\)", "", cell.replace("**", "")).strip()
    return bool(text) and bool(FIGURE.match(text))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def figure_tables_outside_blocks(text: str) -> list[int]:
    """Line numbers of the tables of figures that stand outside every rendered block (fenced
    blocks are a program's printed output, not the docs' tables, and are left alone)."""
    spans = [(m.start(), m.end()) for m in blocks(text)]
    found: list[int] = []
    table: list[tuple[int, str]] = []
    fenced = False
    offset = 0

    def close() -> None:
        if len(table) > 2 and re.match(r"^\|(\s*:?-+:?\s*\|)+\s*$", table[1][1]):
            body = [cell for _, row in table[2:] for cell in _cells(row)]
            numbers = any(re.search(r"\d", re.sub(r"`[^`]*`", "", cell)) for cell in body)
            if any(map(is_figure, body)) or (MEASURE.search(table[0][1]) and numbers):
                found.append(table[0][0])
        table.clear()

    for number, line in enumerate(text.splitlines(keepends=True), 1):
        inside = any(start <= offset < end for start, end in spans)
        offset += len(line)
        if re.match(r"^ *```", line):
            fenced = not fenced
        if line.startswith("|") and not fenced and not inside:
            table.append((number, line.rstrip("\n")))
        else:
            close()
    close()
    return found


# ---- figures written in prose ---------------------------------------------------------------

# A measured figure in a sentence: a number (or a range) with a unit of time, size, rate, share or
# ratio ("0.358 s", "60.9-69.3 s", "86.8 MB", "7.6 ± 1.6 MB/min", "7.5%", "4.9x", "18 times"), or a
# score beside its name ("precision 0.929", "0.07 R@10"). Counts and bare numbers are not looked
# for: they are mostly sizes of corpora, examples and settings.
_AMOUNT = r"[~≈±+−-]?\d[\d,]*(?:\.\d+)?(?:\s?[-–±]\s?\d[\d,]*(?:\.\d+)?)?"
_UNIT = (r"(?:\s(?:s|ms|µs|min|h|seconds|minutes|hours|times)\b"
         r"|\s?(?:ms|µs|MB/min|MB|GB|TB|kB|KB|KiB|MiB|GiB|calls/s)\b|%|x\b|×)")
PROSE_FIGURE = re.compile(
    rf"(?<![\w.,@/]){_AMOUNT}{_UNIT}"
    r"|\b(?:R@\d+|precision|recall|accuracy|win rate)\s+(?:of\s+)?\d*\.\d+"
    r"|(?<![\w.])\d*\.\d+\s+R@\d+")
# What a setting, a schedule or a bound reads like: the figure right after one of these words
# ("default 30 s", "every 2 s", "at most 16 MB", "under 1 MB", "after 5 s", "bound of 1
# MB/min", "poll 2 s"), before "by default", or in brackets right after a setting's name in code
# ("`load_timeout_s` (300 s"). Those are what the program is told, not what a run measured.
_SETTING_BEFORE = re.compile(r"(?:\b(?:default|every|at most|up to|under|within|after|bound|"
                             r"bound of|poll)\s+[~≈]?|`\s*\()$")
_SETTING_AFTER = re.compile(r"^[^.;()]{0,30}\bby default\b")


def _mask(text: str, pattern: str, flags: int = 0) -> str:
    """`text` with each match of `pattern` blanked (its newlines kept, so lines keep their
    numbers)."""
    return re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m[0]), text, flags=flags)


def prose(text: str) -> str:
    """The sentences of a page, everything else blanked in place: rendered blocks, fenced
    blocks (a program's output), HTML comments, table lines (figure_tables_outside_blocks
    judges tables) and the inside of code spans (names, commands, printed lines)."""
    text = _mask(text, BLOCK.pattern, BLOCK.flags)
    text = _mask(text, r"^ *```.*?^ *```[^\n]*$", re.MULTILINE | re.DOTALL)
    text = _mask(text, r"<!--.*?-->", re.DOTALL)
    text = _mask(text, r"^ *\|[^\n]*$", re.MULTILINE)
    return re.sub(r"`[^`]*`", lambda m: "`" + re.sub(r"[^\n]", "_", m[0][1:-1]) + "`", text)


def prose_figures(text: str, allowed: tuple[str, ...] = ()) -> list[tuple[int, str, str]]:
    """(line, figure, the `allowed` phrase it stands in or "") for each measured figure written in
    the page's sentences outside every rendered block, settings and bounds aside. A phrase of
    `allowed` matches across line breaks (its spaces stand for any run of white space)."""
    sentences = prose(text)
    spans = [(m.start(), m.end(), phrase) for phrase in allowed
             for m in re.finditer(r"\s+".join(map(re.escape, phrase.split())), sentences)]
    found = []
    for match in PROSE_FIGURE.finditer(sentences):
        before = sentences[max(0, match.start() - 20):match.start()]
        if _SETTING_BEFORE.search(before) or _SETTING_AFTER.match(sentences[match.end():]):
            continue
        phrase = next((p for start, end, p in spans
                       if start <= match.start() and match.end() <= end), "")
        line = sentences.count("\n", 0, match.start()) + 1
        found.append((line, " ".join(match[0].split()), phrase))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming the blocks that differ")
    args = parser.parse_args(argv)
    stale = False
    for page in pages():
        text = page.read_text(encoding="utf-8")
        names = stale_blocks(text)
        if not names:
            continue
        stale = True
        where = page.relative_to(REPO)
        if args.check:
            print(f"{where}: {', '.join(names)} differ from their results", file=sys.stderr)
        else:
            page.write_text(rendered(text), encoding="utf-8")
            print(f"{where}: rendered {', '.join(names)}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())

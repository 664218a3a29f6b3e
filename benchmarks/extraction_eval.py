"""Entity extraction quality of the builtin provider on prose its heuristics were not written from.

    python benchmarks/extraction_eval.py            # precision, recall, F1: overall and per source
    python benchmarks/extraction_eval.py --details  # also each passage's misses and wrong names

Passages and labels: benchmarks/data/extraction_gold.json (15 passages from three sources in
../shared/eval-data, stored as offsets into the source files, labelled by hand; see
benchmarks/data/README.md for the labelling rules). Each passage is extracted as one text unit
with the default entity types (organization, person, geo, event).

Scoring. Names are compared after canopy.ids.normalize_name (case, punctuation, whitespace) and
without a leading title ("Dr.", "Agent", "the"). A gold entity lists its name and the aliases the
passage uses ("Alex Mercer": "Alex", "Mercer"):
- untyped: an extracted name is correct if it is a form of a gold entity; recall counts gold
  entities with at least one form extracted; precision counts extracted names;
- typed: the same, but the extracted type must be the gold type, and gold entities of type
  `other` (products, diseases, programmes: named, but of no type the extractor has) are left out;
- entities marked `optional` (borderline names) count neither way.
Figures are micro-averaged over the passages of a source, and over all passages for `all`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from canopy.ids import normalize_name  # noqa: E402
from canopy.model import TextUnit  # noqa: E402
from canopy.providers.builtin.extraction import extract_unit  # noqa: E402

GOLD = REPO / "benchmarks" / "data" / "extraction_gold.json"
EVAL_DATA = REPO.parent / "shared" / "eval-data"
_TITLES = ("the", "agent", "agents", "dr", "mr", "mrs", "ms", "prof", "professor")


def key(name: str) -> str:
    words = normalize_name(name).split()
    while len(words) > 1 and words[0] in _TITLES:
        words = words[1:]
    return " ".join(words)


@lru_cache(maxsize=8)
def _source_text(source: str, member: str | None) -> str:
    path = EVAL_DATA / source
    if member is not None:
        with zipfile.ZipFile(path) as z:
            return z.read(member).decode("utf-8")
    if path.suffix == ".json":  # GraphRAG-Bench: one record holding the whole corpus
        return str(json.loads(path.read_text(encoding="utf-8"))[0]["context"])
    return path.read_text(encoding="utf-8")


def passage_text(p: dict[str, Any]) -> str:
    text = _source_text(p["source"], p.get("member"))[p["start"] : p["end"]]
    if hashlib.sha256(text.encode()).hexdigest() != p["sha256"]:
        raise SystemExit(f"{p['id']}: the source text differs from the labelled one")
    return text


@dataclass
class Score:
    tp: int = 0  # extracted names that are a gold form
    fp: int = 0
    found: int = 0  # gold entities with a form extracted
    gold: int = 0
    misses: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    def add(self, other: Score) -> None:
        self.tp += other.tp
        self.fp += other.fp
        self.found += other.found
        self.gold += other.gold

    def prf(self) -> tuple[float, float, float]:
        p = self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0
        r = self.found / self.gold if self.gold else 0.0
        return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def score(extracted: dict[str, str], entities: list[dict[str, Any]], *, typed: bool) -> Score:
    """`extracted`: normalized name -> type."""
    forms: dict[str, int] = {}
    for i, e in enumerate(entities):
        for name in [e["name"], *e.get("aliases", [])]:
            forms[key(name)] = i
    ignored = {i for i, e in enumerate(entities)
               if e.get("optional") or (typed and e["type"] == "other")}
    s = Score(gold=len(entities) - len(ignored))
    hit: set[int] = set()
    for name, kind in sorted(extracted.items()):
        i = forms.get(name)
        if i is not None and i in ignored:
            continue
        if i is not None and (not typed or entities[i]["type"] == kind):
            s.tp += 1
            hit.add(i)
        else:
            s.fp += 1
            s.wrong.append(f"{name} ({kind})" if i is None or not typed
                           else f"{name} ({kind}, gold {entities[i]['type']})")
    s.found = len(hit)
    s.misses = [f"{e['name']} ({e['type']})" for i, e in enumerate(entities)
                if i not in ignored and i not in hit]
    return s


def extract(pid: str, text: str) -> dict[str, str]:
    unit = TextUnit(id=pid, document_id=pid, ordinal=0, text=text, n_tokens=0, char_start=0,
                    char_end=len(text))
    return {key(e.name): e.type for e in extract_unit(unit).entities}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--details", action="store_true",
                    help="list each passage's missed gold entities and wrong names")
    args = ap.parse_args()
    if not EVAL_DATA.exists():
        raise SystemExit(f"eval data not found at {EVAL_DATA}")
    passages = json.loads(GOLD.read_text(encoding="utf-8"))["passages"]
    totals: dict[tuple[str, bool], Score] = {}
    for p in passages:
        got = extract(p["id"], passage_text(p))
        group = p["id"].split("-")[0]
        for typed in (False, True):
            s = score(got, p["entities"], typed=typed)
            for g in (group, "all"):
                totals.setdefault((g, typed), Score()).add(s)
            if args.details:
                print(f"{p['id']} {'typed' if typed else 'names'}: missed {s.misses}; "
                      f"wrong {s.wrong}", file=sys.stderr)
    print("| source | passages | gold | names P | names R | names F1 "
          "| typed P | typed R | typed F1 |")
    print("|---|---|---|---|---|---|---|---|---|")
    groups = sorted({g for g, _ in totals if g != "all"}) + ["all"]
    for g in groups:
        n = sum(1 for p in passages if g == "all" or p["id"].split("-")[0] == g)
        u, t = totals[(g, False)], totals[(g, True)]
        cells = " | ".join(f"{x:.3f}" for x in (*u.prf(), *t.prf()))
        print(f"| {g} | {n} | {u.gold} | {cells} |")


if __name__ == "__main__":
    main()

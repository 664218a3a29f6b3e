"""Merge precision and recall of entity resolution (canopy.aliases) on a hand-labelled sample.

    python benchmarks/alias_eval.py --work /tmp/aliases-work            # P/R per corpus and all
    python benchmarks/alias_eval.py --work /tmp/aliases-work --candidates out.jsonl  # to label

The sample is benchmarks/data/alias_pairs.jsonl (how it was drawn and labelled: the README in
benchmarks/data). Each line is one pair of surface names as the builtin provider extracted them
from one DEV corpus: `corpus`, `doc` (the document both occur in, or "*" for a pair of forms
anywhere in the corpus), `a`, `b` and the hand label `same` (true: they name one entity there).
A pair is *merged* when some instance named `a` and some instance named `b` (in that document,
or anywhere for "*") end on one entity key in the builtin index of the corpus.

Each corpus is indexed once with the builtin provider into `--work` (router_eval's folders:
multihop = the 609 MultiHop-RAG articles, musique = the 1,890 MuSiQue paragraphs, carol = A
Christmas Carol, medical = GraphRAG-Bench's medical guides). Also printed: each corpus's entity
count, and what it would be with names merged by normalized name alone (before issue 31): the
distinct `canopy.ids.normalize_name` of the instances' written names in live units.

Output: the lines above on stdout, and JSON in benchmarks/results/alias_eval.json (`--out`): the
commit, the command and the machine, and per corpus and for all pooled the pairs, true pairs,
merged pairs, precision, recall and errors, with each corpus's entity counts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sqlite3
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAIRS = REPO / "benchmarks" / "data" / "alias_pairs.jsonl"
CORPORA = ("multihop", "musique", "carol", "medical")
RESULTS_FILE = REPO / "benchmarks" / "results" / "alias_eval.json"


def instances(index: Path) -> list[tuple[str, str, str, str]]:
    """(document path, unit id, key, written name) of every entity instance in a live unit."""
    with sqlite3.connect(index / "canopy.sqlite") as db:
        return db.execute(
            "SELECT d.path, i.unit_id, i.key, i.name FROM entity_instances i "
            "JOIN text_units u ON u.id = i.unit_id JOIN documents d ON d.id = u.document_id"
        ).fetchall()


def merged(rows: list[tuple[str, str, str, str]]) -> dict[tuple[str, str], set[str]]:
    """Keys of each (document, written name), and of each ("*", written name)."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path, _, key, name in rows:
        out[(path, name)].add(key)
        out[("*", name)].add(key)
    return out


def counts(index: Path, rows: list[tuple[str, str, str, str]]) -> tuple[int, int]:
    """(entities now, entities by normalized name alone)."""
    from canopy.ids import normalize_name

    with sqlite3.connect(index / "canopy.sqlite") as db:
        now = db.execute("SELECT COUNT(*) FROM entities").fetchone()[0]
    return int(now), len({normalize_name(name) for *_, name in rows if normalize_name(name)})


def score(pairs: list[dict[str, Any]], keys: dict[str, dict[tuple[str, str], set[str]]]
          ) -> dict[str, Any]:
    tp = fp = fn = tn = 0
    errors = []
    for p in pairs:
        k = keys[p["corpus"]]
        got = bool(k.get((p["doc"], p["a"]), set()) & k.get((p["doc"], p["b"]), set()))
        if got and p["same"]:
            tp += 1
        elif got:
            fp += 1
            errors.append(("false merge", p["a"], p["b"]))
        elif p["same"]:
            fn += 1
            errors.append(("missed", p["a"], p["b"]))
        else:
            tn += 1
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return {"true": tp + fn, "false": fp + tn, "merged": tp + fp, "precision": round(precision, 3),
            "recall": round(recall, 3), "errors": errors}


def as_json(r: dict[str, Any]) -> dict[str, Any]:
    """A score as the results file keeps it."""
    out = {"pairs": r["true"] + r["false"], "true_pairs": r["true"], "false_pairs": r["false"],
           "merged": r["merged"], "precision": r["precision"], "recall": r["recall"]}
    out.update({k: r[k] for k in ("entities", "entities_by_normalized_name") if k in r})
    return {**out, "errors": [list(e) for e in r["errors"]]}


_CAPS = re.compile(r"^[A-Z][A-Z.&]{1,7}$")


def candidates(corpus: str, rows: list[tuple[str, str, str, str]], rng: random.Random,
               per_kind: int) -> list[dict[str, Any]]:
    """Pairs to label, drawn more broadly than the resolver links (so both labels occur):
    names of one document sharing a word (one within the other, or not), one written in capitals
    beside a longer name with its first letter, and forms of the corpus equal but for spacing,
    punctuation or a legal suffix (a sample of each kind, seeded)."""
    from canopy.ids import entity_key, normalize_name

    by_doc: dict[str, set[str]] = defaultdict(set)
    for path, _, _, name in rows:
        by_doc[path].add(name)
    kinds: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for path, names in by_doc.items():
        norm = {n: normalize_name(n) for n in names}
        for a in names:
            for b in names:
                if a >= b or norm[a] == norm[b] or not norm[a] or not norm[b]:
                    continue
                wa, wb = set(norm[a].split()), set(norm[b].split())
                short, long = (a, b) if _CAPS.match(a) else (b, a)
                if _CAPS.match(short) and len(norm[long].split()) >= 2:
                    if norm[long][0] == norm[short][0]:  # a look-alike initialism at least
                        kinds["capitals"].add((path, a, b))
                elif wa & wb and (wa <= wb or wb <= wa):
                    kinds["contained"].add((path, a, b))
                elif wa & wb:
                    kinds["shared word"].add((path, a, b))
    written: dict[str, dict[str, str]] = defaultdict(dict)  # key -> normalized -> written
    for *_, name in sorted(rows):
        written[entity_key(name)].setdefault(normalize_name(name), name)
    for forms in written.values():
        names = [forms[n] for n in sorted(forms)]
        for a, b in zip(names, names[1:], strict=False):
            kinds["form"].add(("*", a, b))
    out = []
    for kind, found in sorted(kinds.items()):
        for doc, a, b in rng.sample(sorted(found), min(per_kind, len(found))):
            out.append({"corpus": corpus, "doc": doc, "a": a, "b": b, "kind": kind})
    # A second draw (its own seed, so the first is unchanged) of the two shapes where true
    # pairs are likeliest: a word that ends a longer name of the document ("Altman" / "Sam
    # Altman"), and capitals that are the initials of one ("EU" / "European Union").
    taken = {(p["doc"], p["a"], p["b"]) for p in out}
    likely: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for path, names in by_doc.items():
        norm = {n: normalize_name(n) for n in names}
        for a in names:
            for b in names:
                if a == b or not norm[a] or not norm[b] or norm[a] == norm[b]:
                    continue
                wa, wb = norm[a].split(), norm[b].split()
                pair = (path, min(a, b), max(a, b))
                if len(wa) == 1 and len(wb) >= 2 and wb[-1] == wa[0]:
                    likely["last word"].add(pair)
                if _CAPS.match(a) and len(wb) >= 2 and "".join(wa) in (
                        "".join(w[0] for w in wb),
                        "".join(w[0] for w in wb if w not in ("of", "the", "and", "for"))):
                    likely["initials"].add(pair)
    second = random.Random(f"{corpus}-second-draw")
    for kind, found in sorted(likely.items()):
        found = {f for f in found if f not in taken}
        for doc, a, b in second.sample(sorted(found), min(per_kind, len(found))):
            out.append({"corpus": corpus, "doc": doc, "a": a, "b": b, "kind": kind})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="folder of the corpora's indexes")
    ap.add_argument("--corpora", nargs="*", default=list(CORPORA), choices=CORPORA)
    ap.add_argument("--candidates", type=Path, default=None,
                    help="write pairs to label (JSONL) instead of scoring the sample")
    ap.add_argument("--per-kind", type=int, default=25, help="candidates per corpus and kind")
    ap.add_argument("--pairs", type=Path, default=PAIRS, help="the labelled sample")
    ap.add_argument("--out", type=Path, default=RESULTS_FILE, help="JSON of the scores")
    args = ap.parse_args()
    from benchmarks.retrieval_eval import _commit, machine
    from benchmarks.router_eval import corpus_index

    rows = {c: instances(corpus_index(c, args.work)[1]) for c in args.corpora}
    if args.candidates is not None:
        rng = random.Random(31)
        with args.candidates.open("w", encoding="utf-8") as f:
            for c in args.corpora:
                for p in candidates(c, rows[c], rng, args.per_kind):
                    f.write(json.dumps(p, ensure_ascii=False) + "\n")
        return
    pairs = [json.loads(line) for line in args.pairs.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    pairs = [p for p in pairs if p["corpus"] in args.corpora]
    keys = {c: merged(r) for c, r in rows.items()}
    result: dict[str, Any] = {}
    for c in args.corpora:
        now, before = counts(corpus_index(c, args.work)[1], rows[c])
        result[c] = {**score([p for p in pairs if p["corpus"] == c], keys),
                     "entities": now, "entities_by_normalized_name": before}
    result["all"] = score(pairs, keys)
    for name, r in result.items():
        extra = (f"  entities {r['entities']} (by normalized name alone "
                 f"{r['entities_by_normalized_name']})" if "entities" in r else "")
        print(f"{name:9} pairs {r['true']:3} true / {r['false']:3} false  merged {r['merged']:3}  "
              f"precision {r['precision']:.3f}  recall {r['recall']:.3f}{extra}")
    for kind, a, b in result["all"]["errors"]:
        print(f"  {kind}: {a!r} / {b!r}")
    report = {"commit": _commit(), "date": time.strftime("%Y-%m-%d"),
              "command": "python benchmarks/alias_eval.py " + " ".join(sys.argv[1:]),
              "machine": machine(), "pairs_file": os.path.relpath(args.pairs, REPO),
              "corpora": {c: as_json(result[c]) for c in args.corpora},
              "all": {k: v for k, v in as_json(result["all"]).items() if k != "errors"}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

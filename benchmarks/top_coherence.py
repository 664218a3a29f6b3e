"""How well the top of the hierarchy hangs together: do a top-level community's documents share
a topic? (issue 31, "a top level that hangs together").

    python benchmarks/top_coherence.py                       # builds the 609-article index
    python benchmarks/top_coherence.py --index /tmp/rev/multihop-rag-index   # reuses one

MultiHop-RAG's articles each carry a category in the corpus metadata (sports, technology,
entertainment, business, science, health), which the index never sees: the files hold only
"# {title}" and the body (benchmarks/multihop.py's builtin index). For each top-level community,
every mention of one of its members in a text unit counts for that unit's article's category;
the community's *purity* is the share of its mentions in its most frequent category. Printed: the
number of top-level communities, their mean purity (plain, and weighted by members), the share
whose purity is at least one half, and the purity a community would have by chance (the
largest category's share of all mentions), then the largest communities one per line.

JSON to --out (default benchmarks/results/top_coherence.json) with the commit and the command.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.multihop import CORPUS, machine, multihop_index  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "top_coherence.json"
TITLE_CHARS = 120


@dataclass(frozen=True)
class Top:
    community: str
    members: int
    documents: int
    category: str  # the most frequent category of its members' mentions
    purity: float  # that category's share of the mentions


def categories_by_document(db: sqlite3.Connection) -> dict[str, str]:
    """Document id -> its article's category, matched by title (the file's heading, which the
    index keeps to its first TITLE_CHARS characters)."""
    articles = json.loads(CORPUS.read_text(encoding="utf-8"))
    by_title = {a["title"].strip()[:TITLE_CHARS].strip(): a["category"] for a in articles}
    out = {}
    for did, title in db.execute("SELECT id, title FROM documents"):
        category = by_title.get((title or "").strip()[:TITLE_CHARS].strip())
        if category is not None:
            out[did] = category
    return out


def tops(db: sqlite3.Connection) -> list[Top]:
    """Every top-level community's purity, largest first."""
    category = categories_by_document(db)
    unit_doc = dict(db.execute("SELECT id, document_id FROM text_units"))
    units_of = {eid: json.loads(units) for eid, units in
                db.execute("SELECT id, units FROM entities")}
    out = []
    for cid, n in db.execute("SELECT id, n_members FROM communities "
                             "WHERE parent IS NULL OR parent = ''").fetchall():
        counts: Counter[str] = Counter()
        documents: set[str] = set()
        for (eid,) in db.execute("SELECT entity_id FROM community_members "
                                 "WHERE community_id = ?", (cid,)):
            for unit in units_of.get(eid, ()):
                doc = unit_doc.get(unit)
                if doc in category:
                    counts[category[doc]] += 1
                    documents.add(doc)
        if counts:
            top, c = counts.most_common(1)[0]
            out.append(Top(cid, n, len(documents), top, round(c / sum(counts.values()), 3)))
    return sorted(out, key=lambda t: -t.members)


def chance(db: sqlite3.Connection) -> float:
    """The largest category's share of all mentions: the purity of a random community."""
    category = categories_by_document(db)
    unit_doc = dict(db.execute("SELECT id, document_id FROM text_units"))
    counts: Counter[str] = Counter()
    for (units,) in db.execute("SELECT units FROM entities"):
        for unit in json.loads(units):
            doc = unit_doc.get(unit)
            if doc in category:
                counts[category[doc]] += 1
    return round(max(counts.values()) / sum(counts.values()), 3)


def summary(found: list[Top], by_chance: float) -> dict[str, Any]:
    members = sum(t.members for t in found)
    return {"top_level": len(found),
            "mean_purity": round(sum(t.purity for t in found) / len(found), 3),
            "member_weighted_purity": round(sum(t.purity * t.members for t in found) / members, 3),
            "share_at_least_half": round(sum(t.purity >= 0.5 for t in found) / len(found), 3),
            "chance_purity": by_chance}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--index", type=Path, default=None,
                   help="an index of the 609 articles (benchmarks/multihop.py); built if absent")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    with multihop_index(args.index) as (_, index_dir):
        with sqlite3.connect(f"file:{index_dir / 'canopy.sqlite'}?mode=ro", uri=True) as db:
            found = tops(db)
            by_chance = chance(db)
            matched = len(categories_by_document(db))
    report = {"commit": machine()["commit"], "machine": machine(), "articles_matched": matched,
              "command": " ".join(["python", "benchmarks/top_coherence.py", *sys.argv[1:]]),
              "summary": summary(found, by_chance), "tops": [asdict(t) for t in found]}
    print(f"articles matched to their category: {matched}")
    for key, value in report["summary"].items():
        print(f"{key}: {value}")
    for t in found[:15]:
        print(f"  {t.members:5d} members, {t.documents:3d} articles: {t.purity:.2f} {t.category}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

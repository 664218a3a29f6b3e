"""Mutations of the safety-critical rules (design §9; issue 30): each must fail a test.

    python benchmarks/safety_mutations.py                      # every mutation, default tests
    python benchmarks/safety_mutations.py --only stale-gate    # one (repeatable)
    python benchmarks/safety_mutations.py --out benchmarks/results/safety_mutations.json

Each mutation is one textual edit of one source file: the serving gate's stale check
(canopy/store/rows.py), the serving states (acl/access.py), the policy's labels and grants
(acl/policy.py, acl/caller.py), what the reader serves (acl/reader.py) and how the indexer gives
units and artifacts their access classes (indexer/). For each, the repository (without .git) is
copied to a temporary folder, the edit applied there (the checkout is never touched), and the
tests run with `-x` in the order given (fast files first); the first failing test is the one that
caught it. A mutation no test catches is listed as SURVIVED and the script exits 1, unless it
is marked equivalent (it changes no behaviour: another rule already does what it removes; the
reason is printed, and a combined mutation removes both), when it is listed as "equivalent".
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = ["tests/indexer/operations/test_staleness.py", "tests/acl/test_acl_globs.py",
         "tests/test_update_compositions.py", "tests/acl/test_acl_views.py",
         "tests/server/engines/test_engine_rules.py", "tests/acl/test_acl_leaks.py",
         "tests/test_erasure.py"]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    what: str
    also: tuple[tuple[str, str, str], ...] = ()  # more (path, old, new) edits of one mutation
    equivalent: str = ""  # why surviving is expected: the behaviour is unchanged


_REVOKE_CLASS = ('            db.execute("UPDATE text_units SET acl = ? WHERE document_id = ?", '
                 "(acl, doc_id))\n")

MUTATIONS = [
    Mutation("stale-gate", "canopy/store/rows.py",
             "return not self.stale and self.acl <= readable", "return self.acl <= readable",
             "the gate's readable_by ignores the stale flag (finding 10)"),
    Mutation("state-ignores-stale", "acl/access.py",
             "    if not gate.stale:\n        if gate.acl <= readable:",
             "    if True:\n        if gate.acl <= readable:",
             "an entity/relationship state ignores the stale flag"),
    Mutation("state-full-if-any", "acl/access.py",
             "        if gate.acl <= readable:\n            return State.FULL",
             "        if not gate.acl.isdisjoint(readable):\n            return State.FULL",
             "an artifact partly readable is served whole"),
    Mutation("state-view-if-none", "acl/access.py",
             "return State.NONE if gate.acl.isdisjoint(readable) else State.VIEW",
             "return State.VIEW",
             "an artifact with no readable unit is served as a view"),
    Mutation("stale-view-always", "acl/access.py",
             "    return State.VIEW if live_readable() else State.NONE\n\n\ndef community_state",
             "    return State.VIEW\n\n\ndef community_state",
             "a stale artifact is a view even with no live readable unit"),
    Mutation("community-report-unchecked", "acl/access.py",
             "if fresh and report is not None and report.readable_by(readable) and not "
             "community.stale:",
             "if fresh and report is not None and not community.stale:",
             "a community's canonical report is served without checking its gate"),
    Mutation("community-none-as-view", "acl/access.py",
             "        if community.acl.isdisjoint(readable):\n            return State.NONE",
             "        if False:\n            return State.NONE",
             "a community with no readable member is served as a view"),
    Mutation("community-stale-view-always", "acl/access.py",
             "    return State.VIEW if any_member() else State.NONE\n",
             "    return State.VIEW\n",
             "a stale community is a view even with no member left"),
    Mutation("any-label-reads-all", "acl/policy.py",
             "return who.unrestricted or bool(who.labels.intersection(labels))",
             "return who.unrestricted or bool(who.labels)",
             "a principal with any label reads every document"),
    Mutation("last-rule-wins", "acl/policy.py",
             "for i, (matches, labels) in enumerate(rules):",
             "for i, (matches, labels) in reversed(list(enumerate(rules))):",
             "the last matching rule decides instead of the first"),
    Mutation("default-dropped", "acl/policy.py",
             "return tuple(sorted(set(self.settings.default))), None",
             "return (\"staff\",), None",
             "paths no rule matches get a fixed label instead of the default"),
    Mutation("case-unchecked", "acl/policy.py",
             "        if folded == labels:\n            return labels",
             "        if True:\n            return labels",
             "a path spelled in another case than its rule is indexed (finding 9)"),
    Mutation("caller-reads-every-class", "acl/caller.py",
             "readable = frozenset(c for c, labels in classes.items() if policy.readable(labels, "
             "principal))",
             "readable = frozenset(classes)",
             "a caller's readable classes are every class of the index"),
    Mutation("units-unfiltered", "acl/reader.py",
             "if u in got and got[u][0].acl in self.caller.readable}",
             "if u in got}",
             "text units are served whatever their class"),
    Mutation("claims-unfiltered", "acl/reader.py",
             "readable = self.trivial or (not c.gate.stale and c.gate.acl <= "
             "self.caller.readable)",
             "readable = True",
             "claims are served whatever their unit's class"),
    Mutation("trivial-despite-revocation", "acl/reader.py",
             "self.trivial = caller.reads_everything and all_live",
             "self.trivial = caller.reads_everything",
             "a caller who reads everything is served canonical rows during a revocation"),
    Mutation("search-not-prefiltered", "acl/reader.py",
             "hidden_acl=self.caller.hidden,", "hidden_acl=(),",
             "search is not prefiltered by the classes the caller may not read"),
    Mutation("relabel-keeps-old-class", "indexer/stages/documents.py",
             "rows.append(replace(row, acl=new.acl, n_terms=n_terms,",
             "rows.append(replace(row, acl=row.acl, n_terms=n_terms,",
             "a relabelled document's restaged units keep their stored class",
             equivalent="the revocation commit has given every unit of a relabelled document "
                        "its new class before the restage reads them (the restage is a second "
                        "guard): see relabel-keeps-old-class-and-revocation-too"),
    Mutation("edit-hides-relabel", "indexer/stages/documents.py",
             "if old is not None and same_id and relabel(old, plan.documents[doc_id]):",
             "if old is not None and same_id and old.document.content_hash == h and "
             "relabel(old, plan.documents[doc_id]):",
             "an edit in the update that relabels a document skips the relabel (finding 1)"),
    Mutation("no-repair", "indexer/stages/documents.py",
             "or old.document.id in misfiled)", ")",
             "a no-change run leaves units whose class disagrees with the policy"),
    Mutation("revocation-keeps-class", "canopy/store/revocations.py", _REVOKE_CLASS, "",
             "a relabel does not apply to the units at once (revocation first)"),
    Mutation("relabel-keeps-old-class-and-revocation-too", "indexer/stages/documents.py",
             "rows.append(replace(row, acl=new.acl, n_terms=n_terms,",
             "rows.append(replace(row, acl=row.acl, n_terms=n_terms,",
             "both rules that give a relabelled document's units their class, off together",
             also=(("canopy/store/revocations.py", _REVOKE_CLASS, ""),)),
    Mutation("relabel-forgotten-after-interruption", "indexer/pipeline.py",
             "misfiled=misfiled | unfinished)", "misfiled=misfiled)",
             "a relabel whose regeneration was interrupted is not finished by the next run"),
    Mutation("deleted-claims-kept", "indexer/pipeline.py",
             "*units.relabelled, *revoked, *live_retry]", "*units.relabelled, *live_retry]",
             "the regeneration after a deletion keeps the deleted units' claims (finding 3)"),
    Mutation("stale-view-keyed-by-ids", "acl/reader.py",
             '        return [*(f"{u}:{a}" for u, a in sorted(live.items())),\n'
             '                "reads:" + ",".join(map(str, readable))]',
             "        return sorted(live)",
             "a stale artifact's view is keyed by its live units' ids alone"),
    Mutation("entity-gate-first-unit", "indexer/operations/merging.py",
             "gate = Gate(frozenset(a for _, a in d.unit_acl), acl_signature(d.unit_acl), False)",
             "gate = Gate(frozenset(a for _, a in d.unit_acl[:1]), acl_signature(d.unit_acl), "
             "False)",
             "an entity's or relationship's gate holds only its first unit's class"),
    Mutation("community-gate-first-member", "indexer/stages/reports.py",
             "gate = Gate(frozenset(a for e in ents for a in e.gate.acl),",
             "gate = Gate(frozenset(a for e in ents[:1] for a in e.gate.acl),",
             "a community's gate holds only its first member's classes"),
    Mutation("stale-parents-skipped", "indexer/operations/staleness.py",
             "            todo.append(node.parent)\n", "            pass\n",
             "a recomputed community's ancestors are not recomputed (their reports go stale)"),
    Mutation("revocation-stale-ignored", "indexer/operations/staleness.py",
             "out = set(change.placed) | set(change.stale) | set(change.retry)",
             "out = set(change.placed) | set(change.retry)",
             "communities a revocation left stale are not regenerated"),
]


def _copy(dst: Path) -> None:
    shutil.copytree(REPO, dst, ignore=shutil.ignore_patterns(
        ".git", "results", "build", "__pycache__", ".pytest_cache", ".mypy_cache", ".canopy"))


def run(m: Mutation, tests: list[str], timeout: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="canopy-mutation-") as tmp:
        root = Path(tmp) / "repo"
        _copy(root)
        found = 0
        for path, old, new in ((m.path, m.old, m.new), *m.also):
            source = root / path
            text = source.read_text(encoding="utf-8")
            if old not in text:
                return {"name": m.name, "what": m.what,
                        "outcome": f"NOT APPLIED (text not found in {path})"}
            found += text.count(old)
            source.write_text(text.replace(old, new), encoding="utf-8")
        began = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider",
                 *tests], cwd=root, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"name": m.name, "what": m.what, "outcome": f"TIMEOUT after {timeout:.0f} s"}
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.M)
        outcome = "caught" if done.returncode else "equivalent" if m.equivalent else "SURVIVED"
        return {"name": m.name, "what": m.what, "file": m.path, "replaced": found,
                "outcome": outcome, "equivalent": m.equivalent or None,
                "caught_by": failed[0] if failed else None,
                "seconds": round(time.monotonic() - began, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="run only this mutation (repeatable)")
    ap.add_argument("--tests", nargs="+", default=TESTS, help="test files, in order")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per mutation, seconds")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    results = []
    for m in chosen:
        r = run(m, args.tests, args.timeout)
        results.append(r)
        print(f"{r['name']:<30} {r['outcome']:<10} {r.get('caught_by') or ''} "
              f"({r.get('seconds', '-')} s) - {r['what']}", flush=True)
        if r["outcome"] == "equivalent":
            print(f"{'':<30} (equivalent: {r['equivalent']})", flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0 if all(r["outcome"] in ("caught", "equivalent") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The router behind the `search` tool and `canopy query -m auto`: for callers that do not pick
an engine, classify the question and hand it to the engine that suits it (design §6):

- global_search for a question about the collection as a whole (sensemaking: themes, trends,
  what recurs across documents; Edge et al. 2024 §3.1), and for a question about change over
  time (canopy.server.engines.change_questions), which it answers period by period;
- local_search for a question that names entities of the index, or joins several facts;
- basic_search for a point question: one value (a count, a date, a place) stated in a passage.

The result says which engine answered and why (`RouteInfo`). A question about change is
recognised first, by its grammar, and goes to global_search without a classification call. The
other signals are general, not fitted to a question template (rule_route gives their order):
1. entity linking against the index, through the caller's view: a name the question writes
   (with a capital letter past its first word, or in CJK) that is an entity the caller can see.
   A name found in PERVASIVE_SHARE or more of the caller's passages is a subject of the whole
   collection ("Orlin" in a folder of Orlin Foods' board minutes): it makes the question local only
   when the question does not also ask across the collection;
2. whether the question is about the collection as a whole: the builtin provider's one
   definition of such a question (canopy.providers.builtin.relevance.is_generic), or English
   question grammar that asks across documents (canopy.providers.builtin.lexicon): a quantifier,
   frequency adverb or overview word ("any", "often", "across", "themes"), a plural subject
   ("what risks are", "how do teams", "reported by the inspectors");
3. whether it asks for one value ("how many", "when", "where") and how many clauses it joins.
With an LLM configured (and `[query] router_llm`), the provider classifies the question in one
short call, given the names linked in step 1, and the rules are the fallback. Questions in other
languages than English rely on step 1 and on the LLM.

Permissions: every name the router links, counts or quotes comes from the caller's view, and
the reason quotes the question's own words for them, so a route never depends on, or reveals,
what the caller cannot read. Measured by benchmarks/router_eval.py, on questions the rules were
written from and on a held-out set they were not (benchmarks/data/router_heldout.jsonl). The
examples here are made up.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from canopy.errors import InvalidOutput
from canopy.providers.builtin import lexicon as lx
from canopy.providers.builtin.relevance import is_generic
from canopy.providers.builtin.text import stem
from canopy.server.context import QueryContext
from canopy.server.engines.basic_engine import basic_search
from canopy.server.engines.budget import (
    check_query,
    check_response_type,
    metered,
    within_window,
)
from canopy.server.engines.change_questions import change_question
from canopy.server.engines.evidence import split_clauses
from canopy.server.engines.global_engine import global_search
from canopy.server.engines.local_engine import local_search, named_entities
from canopy.server.results import RouteInfo, SearchResult

__all__ = [
    "ENGINES",
    "PERVASIVE_SHARE",
    "Linked",
    "Signals",
    "choose_route",
    "link_entities",
    "question_signals",
    "routed_search",
    "rule_route",
]

log = logging.getLogger(__name__)

ENGINES = ("basic", "local", "global")
PERVASIVE_SHARE = 0.25  # a name in this share of the caller's passages is the collection's subject
MANY_CLAUSES = 3  # clauses of detail that make a question multi-hop whatever its wording
MAX_LINKED = 8  # linked names considered (and shown to an LLM classifier) at most
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_CLAUSE_START = re.compile(r"(?:^|[,;:?!]\s*|\s(?:and|or|but)\s+)", re.IGNORECASE)
_PERSONAL = frozenset(("i", "you", "we"))
_WH = frozenset(("what", "which"))


@dataclass(frozen=True)
class Linked:
    """An entity of the caller's view that the question names."""

    written: str  # the question's own words for it
    share: float  # share of the caller's text units it was extracted from
    proper: bool  # written as a name: capitalized past the question's first word, or CJK

    @property
    def pervasive(self) -> bool:
        return self.share >= PERVASIVE_SHARE


@dataclass(frozen=True)
class Signals:
    linked: tuple[Linked, ...]
    generic: bool  # made only of words such as "main themes" (relevance.is_generic)
    value: str | None  # the interrogative asking for one value ("how many")
    spread: str | None  # what asks across the collection ("'often'", "plural 'are'")
    clauses: int  # clauses with content (evidence.split_clauses; 0 for a simple question)

    @property
    def specific(self) -> list[Linked]:
        return [e for e in self.linked if e.proper and not e.pervasive]

    @property
    def pervasive(self) -> list[Linked]:
        return [e for e in self.linked if e.proper and e.pervasive]


def question_signals(query: str, linked: list[Linked] | tuple[Linked, ...] = ()) -> Signals:
    """The signals of `query` given its linked names (pure: no index access)."""
    return Signals(tuple(linked), is_generic(query), _value_question(query), _spread(query),
                   len(split_clauses(query)))


def _value_question(query: str) -> str | None:
    """The interrogative that opens a clause of `query` and asks for one value, if any."""
    starts = [m.end() for m in _CLAUSE_START.finditer(query)]
    low = query.lower()
    for start in starts:
        head = " ".join(_WORD.findall(low[start:start + 40])[:2])
        for phrase in sorted(lx.VALUE_QUESTIONS, key=len, reverse=True):
            if head == phrase or head.startswith(phrase + " "):
                return phrase
    return None


def _spread(query: str) -> str | None:
    """What in `query` asks across the collection: a quantifier or frequency adverb; a plural
    auxiliary among its first words ("what risks are", "how do teams"); a plural noun right
    after "what"/"which" ("which suppliers"); or a plural agent ("reported by the inspectors")."""
    words = _WORD.findall(query.lower())
    for w in words:
        if w in lx.SPREAD_WORDS:
            return f"'{w}'"
    for i, w in enumerate(words[:6]):
        if w in lx.SINGULAR_AUXILIARIES:
            break
        if w in lx.PLURAL_AUXILIARIES and (i + 1 >= len(words) or words[i + 1] not in _PERSONAL):
            return f"plural '{w}'"
    if words and words[0] in _WH:
        for w in words[1:4]:
            if w in lx.PLURAL_AUXILIARIES or w in lx.SINGULAR_AUXILIARIES:
                break
            if _plural(w):
                return f"plural '{w}'"
    for i, w in enumerate(words[:-1]):
        nxt = words[i + 2] if words[i + 1] == "the" and i + 2 < len(words) else words[i + 1]
        if w == "by" and _plural(nxt):
            return f"'by the {nxt}'" if nxt != words[i + 1] else f"'by {nxt}'"
    return None


def _plural(word: str) -> bool:
    return word not in lx.STOPWORDS and word.endswith("s") and stem(word) != word


def rule_route(s: Signals) -> tuple[str, str]:
    """(engine, reason) by the offline rules, in this order:
    1. a question made only of generic words ("what are the main themes?") is global;
    2. one naming an entity of the index that is not the collection's subject is local;
    3. one naming only the collection's subjects is global if it asks across the collection
       ("how have Orlin's prices changed over the years?"), else local ("who leads Kestrel?");
    4. with no name: one asking for a value is basic; one stacking MANY_CLAUSES clauses of
       detail is local (multi-hop, even if it says "all" or "across"); one asking across the
       collection is global; one joining two clauses is local; the rest is a point question
       for basic."""
    reports = ": global_search reads the community reports"
    if s.generic:
        return "global", ("it asks about the collection as a whole (only words such as 'main "
                          f"themes', no topic){reports}")
    if s.specific:
        named = ", ".join(f"'{e.written}'" for e in s.specific)
        which = "an entity" if len(s.specific) == 1 else "entities"
        return "local", (f"it names {which} of the index ({named}): local_search reads the "
                         "neighbourhood in the graph and the sources")
    if s.pervasive:
        names = ", ".join(f"'{e.written}'" for e in s.pervasive)
        if s.spread:
            verb = "runs" if len(s.pervasive) == 1 else "run"
            return "global", (f"it asks across the collection ({s.spread}), and {names} {verb} "
                              f"through much of it{reports}")
        return "local", (f"it names {names}, found in the index, and asks nothing across the "
                         "collection: local_search reads the neighbourhood in the graph and "
                         "the sources")
    if s.value:
        return "basic", (f"it asks for one value ('{s.value}') and names no entity of the "
                         "index: basic_search finds the passages that state it")
    multi = ("local", f"it joins {s.clauses} clauses of detail (a multi-hop question): "
             "local_search gathers entities, relationships and sources")
    if s.clauses >= MANY_CLAUSES:
        return multi
    if s.spread:
        return "global", (f"it names nothing specific and asks across the collection "
                          f"({s.spread}){reports}")
    if s.clauses >= 2:
        return multi
    return "basic", ("it names no entity of the index and asks nothing across the "
                     "collection: basic_search finds the passages most like it")


async def link_entities(ctx: QueryContext, query: str) -> list[Linked]:
    """Entities of the caller's view that `query` names, with the share of the caller's
    passages each was extracted from (views are not built: visible units are counted)."""
    reader = ctx.reader
    ids = named_entities(ctx, query)[:MAX_LINKED]
    if not ids:
        return []
    _, n_units, _ = reader.term_stats(())
    rows = reader.entity_rows(ids)
    states = reader.entity_states(ids)
    first = _WORD.search(query.lower())
    out: list[Linked] = []
    for eid in ids:
        row = rows.get(eid)
        if row is None or not states.get(eid):
            continue
        units = set(row.entity.text_unit_ids)
        seen = len(units) if reader.trivial else len(reader.units(units))
        written, proper = _written(query, row.entity.name, first.start() if first else -1)
        if written:
            out.append(Linked(written, seen / n_units if n_units else 0.0, proper))
    return out


def _written(query: str, name: str, first_word_at: int) -> tuple[str, bool]:
    """How `query` writes the entity `name` (its own words), and whether as a name: CJK, or
    with a capital letter, past the question's first word unless it has more than one."""
    words = re.findall(r"\w+", name)
    if not words:
        return "", False
    if _CJK.search(name):  # not space-delimited: a name is any substring
        at = query.find(name)
        return (name, True) if at >= 0 else ("", False)
    found = re.search(r"(?<!\w)" + r"\W+".join(map(re.escape, words)) + r"(?!\w)", query,
                      re.IGNORECASE)
    if not found:
        return "", False
    text = found.group(0)
    if _CJK.search(text):
        return text, True
    capitals = sum(1 for c in text if c.isupper())
    proper = capitals > 0 and (found.start() != first_word_at or capitals > 1)
    return text, proper


async def choose_route(ctx: QueryContext, query: str) -> RouteInfo:
    """Which engine answers `query`, and why: the provider's classification when it has one
    (an LLM, with `[query] router_llm`), else, or when that call fails, the rules."""
    query = check_query(query)
    change = change_question(query)
    if change is not None:
        return RouteInfo(engine="global", by="rules", reason=(
            f"it asks how something changed over time ({change}): global_search answers it "
            "period by period from the community reports' dated sources"))
    linked = await link_entities(ctx, query)
    signals = question_signals(query, linked)
    engine, reason = rule_route(signals)
    if ctx.settings.router_llm:
        hints = [f"{e.written} (in {e.share:.0%} of the passages)" for e in linked if e.proper]
        try:
            out = await ctx.provider.route(query, hints)
        except InvalidOutput as exc:
            log.warning("the router's classification call failed: %s", exc)
            return RouteInfo(engine=engine, by="rules", reason=reason + " (the model's "
                             "classification was unusable, so the offline rules decided)")
        if out is not None:
            return RouteInfo(engine=out.engine, by="llm", reason=out.reason.strip() or
                             f"the model chose {out.engine}_search")
    return RouteInfo(engine=engine, by="rules", reason=reason)


async def routed_search(ctx: QueryContext, query: str, *,
                        response_type: str = "multiple paragraphs", since: str | None = None,
                        until: str | None = None) -> SearchResult:
    """Route `query` (choose_route), answer it with that engine, and say so in `route`; the
    usage counts the classification call too. `since` / `until` restrict the routing (names
    are linked among what the window holds) and the engine (budget.within_window)."""
    query = check_query(query)
    response_type = check_response_type(response_type)
    within_window(ctx, since, until)
    with metered(ctx) as meter:
        route = await choose_route(ctx, query)
    routing = meter.info()
    # The engine carries the route in its result, so the result's size limit counts it.
    if route.engine == "global":
        result = await global_search(ctx, query, response_type=response_type, route=route,
                                     since=since, until=until)
    elif route.engine == "local":
        result = await local_search(ctx, query, response_type=response_type, route=route,
                                    since=since, until=until)
    else:
        result = await basic_search(ctx, query, response_type=response_type, route=route,
                                    since=since, until=until)
    u = result.usage
    u.llm_calls += routing.llm_calls
    u.prompt_tokens += routing.prompt_tokens
    u.completion_tokens += routing.completion_tokens
    u.embedding_calls += routing.embedding_calls
    u.elapsed_ms += routing.elapsed_ms
    return result

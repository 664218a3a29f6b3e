"""Answer evaluation (`canopy eval DOCS --answers`): the GraphRAG paper's head-to-head comparison
of two query methods by an LLM judge (Edge et al. 2024 §3).

1. Questions. As in the paper (§3.1), generated from the corpus: the top-level community reports
   the caller may read (titles and summaries, best rated first) -> a short description of the
   collection -> N personas -> M tasks per persona -> K questions per (persona, task), each
   needing the whole collection. Or the questions of a file (read_questions).
2. Answers. Each question is answered by both methods: `global` (dynamic selection),
   `global:L` (community level L), `local`, `drift` or `basic`.
3. Judgments. For each question, criterion (comprehensiveness, diversity, empowerment,
   directness, the paper's definitions) and repeat, the judge sees the two answers twice: A as
   Answer 1, then B as Answer 1 (position swapping: an LLM judge favours a position). It names
   the better answer or a tie. Each repeat is its own request ("evaluation run r"), so the
   response cache does not turn repeats into copies; with temperature 0 repeats vary little.
   A judgment that stays unreadable after the client's repair turn is counted as malformed and
   left out, never a crash.
4. Scores. A judgment scores method A 1 (win), 0.5 (tie) or 0 (loss); a question's score is the
   mean of its judgments; the win rate is the mean over questions, with a 95% confidence
   interval by a seeded percentile bootstrap over questions (judgments of one question are not
   independent, so questions are resampled, not judgments). `first_chosen` is the share of
   decisive judgments that picked the answer shown first: far from 0.5 means position bias,
   which swapping cancels in the win rate.

Every call goes through one `ChatClient` (canopy.llm): its usage per task is the cost.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from canopy.errors import CanopyError, ConfigError
from canopy.llm import ChatClient
from canopy.server.context import QueryContext
from canopy.tokenizer import get_tokenizer

__all__ = [
    "CRITERIA",
    "METHODS",
    "CriterionScore",
    "EvalQuestion",
    "Judgment",
    "answer_all",
    "check_methods",
    "corpus_reports",
    "generate_questions",
    "judge_all",
    "read_questions",
    "score",
]

# Edge et al. 2024 §3.3: the four criteria and their definitions, as the judge reads them.
CRITERIA = {
    "comprehensiveness": "How much detail does the answer provide to cover all aspects and "
                         "details of the question?",
    "diversity": "How varied and rich is the answer in providing different perspectives and "
                 "insights on the question?",
    "empowerment": "How well does the answer help the reader understand and make informed "
                   "judgements about the topic?",
    "directness": "How specifically and clearly does the answer address the question?",
}
METHODS = ("global", "global:<level>", "local", "drift", "basic")
REPORTS_TOKENS = 6000  # report titles and summaries the description is written from
BOOTSTRAP = 2000  # resamples of the confidence interval
ANSWERS_AT_ONCE = 4  # questions answered concurrently per method
Progress = Callable[[str], None]


class _Persona(BaseModel):
    name: str
    description: str


class PersonasOut(BaseModel):
    personas: list[_Persona]


class TasksOut(BaseModel):
    tasks: list[str]


class QuestionsOut(BaseModel):
    questions: list[str]


class JudgeOut(BaseModel):
    reasoning: str = Field(description="Why, in one or two sentences")
    winner: Literal[0, 1, 2] = Field(description="1: Answer 1, 2: Answer 2, 0: a tie")


@dataclass(frozen=True)
class EvalQuestion:
    text: str
    persona: str = ""
    task: str = ""


@dataclass(frozen=True)
class Judgment:
    question: int  # index into the questions
    criterion: str
    repeat: int
    a_first: bool  # method A's answer was shown as Answer 1
    winner: str | None  # "A", "B", "tie"; None when the judge's answer was unreadable
    reasoning: str = ""

    @property
    def first_chosen(self) -> bool | None:
        """Whether a decisive judgment picked the answer shown first (None: tie or malformed)."""
        if self.winner not in ("A", "B"):
            return None
        return (self.winner == "A") == self.a_first


@dataclass
class CriterionScore:
    criterion: str
    questions: int  # questions with at least one readable judgment
    a_wins: int
    b_wins: int
    ties: int
    malformed: int
    win_rate: float  # method A's, over questions
    ci_low: float
    ci_high: float
    first_chosen: float | None  # share of decisive judgments for the answer shown first
    per_question: list[float] = field(default_factory=list)


def check_methods(methods: list[str]) -> list[str]:
    """Two distinct methods, each one of METHODS; ConfigError otherwise."""
    for m in methods:
        name, _, level = m.partition(":")
        if name not in ("global", "local", "drift", "basic") or (level and (
                name != "global" or not level.isdigit())):
            raise ConfigError(f"unknown method {m!r}: use two of {', '.join(METHODS)}")
    if len(methods) != 2 or methods[0] == methods[1]:
        raise ConfigError("answer evaluation compares two different methods, e.g. global,local")
    return methods


# ---- 1. questions -------------------------------------------------------------------------------


async def corpus_reports(ctx: QueryContext, budget: int = REPORTS_TOKENS) -> str:
    """Titles and summaries of the caller's top-level reports, best rated first, to `budget`
    tokens: what the collection's description is written from."""
    roots = ctx.reader.roots()
    reports = sorted((await ctx.reader.reports(roots)).values(),
                     key=lambda r: (-(r.rating or 0), r.community_id))
    tok = get_tokenizer()
    parts: list[str] = []
    used = 0
    for r in reports:
        text = f"- {r.title}: {r.summary}"
        n = tok.count(text) + 1
        if parts and used + n > budget:
            break
        parts.append(text)
        used += n
    if not parts:
        raise ConfigError("the index has no community report you may read: nothing to describe")
    return "\n".join(parts)


async def generate_questions(client: ChatClient, reports: str, *, personas: int, tasks: int,
                             questions: int, progress: Progress = lambda _: None
                             ) -> tuple[str, list[EvalQuestion]]:
    """The collection's description and personas x tasks x questions questions (§3.1)."""
    user = [{"role": "user", "content": client.prompts.render("describe", reports=reports)}]
    description = (await client.text("describe", user)).strip()
    progress(f"description: {description[:120]}")
    out = await client.json("personas", _user(client.prompts.render(
        "personas", count=personas, description=description)), PersonasOut)
    people = out.personas[:personas]

    async def for_persona(p: _Persona) -> list[EvalQuestion]:
        who = f"{p.name}: {p.description}"
        listed = await client.json("persona_tasks", _user(client.prompts.render(
            "persona_tasks", count=tasks, description=description, persona=who)), TasksOut)

        async def for_task(task: str) -> list[EvalQuestion]:
            asked = await client.json("questions", _user(client.prompts.render(
                "questions", count=questions, description=description, persona=who,
                task=task)), QuestionsOut)
            return [EvalQuestion(q.strip(), p.name, task) for q in asked.questions[:questions]
                    if q.strip()]

        found = await asyncio.gather(*(for_task(t) for t in listed.tasks[:tasks]))
        return [q for qs in found for q in qs]

    groups = await asyncio.gather(*(for_persona(p) for p in people))
    made = list({q.text: q for qs in groups for q in qs}.values())
    progress(f"{len(made)} questions from {len(people)} personas")
    return description, made


def read_questions(path: Path) -> list[str]:
    """Questions of a plain file: one per line, or JSON lines with a "question" field (gold
    documents are not needed here). Blank lines are skipped."""
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({type(exc).__name__})") from None
    for line in (ln.strip() for ln in lines):
        if not line:
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = line
        text = row.get("question") if isinstance(row, dict) else row
        if isinstance(text, str) and text.strip():
            out.append(text.strip())
    return out


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


# ---- 2. answers ---------------------------------------------------------------------------------


async def answer_all(ctx: QueryContext, questions: list[EvalQuestion], method: str,
                     progress: Progress = lambda _: None) -> list[str]:
    """Each question's answer by `method` (one of METHODS), in order; ANSWERS_AT_ONCE questions
    are answered concurrently (the engines' own calls run concurrently within each)."""
    from canopy.server import engines

    name, _, level = method.partition(":")
    gate = asyncio.Semaphore(ANSWERS_AT_ONCE)
    done = 0

    async def one(q: EvalQuestion) -> str:
        nonlocal done
        async with gate:
            if name == "global":
                r = await engines.global_search(ctx, q.text,
                                                community_level=int(level) if level else None)
            else:
                r = await {"local": engines.local_search, "drift": engines.drift_search,
                           "basic": engines.basic_search}[name](ctx, q.text)
        done += 1
        progress(f"{method}: {done}/{len(questions)} answered")
        return r.answer

    return list(await asyncio.gather(*(one(q) for q in questions)))


# ---- 3. judgments -------------------------------------------------------------------------------


async def judge_all(client: ChatClient, questions: list[EvalQuestion], answers_a: list[str],
                    answers_b: list[str], *, repeats: int, criteria: list[str] | None = None,
                    progress: Progress = lambda _: None) -> list[Judgment]:
    """Every (question, criterion, repeat) judged in both orders, concurrently (the client's
    limiter bounds the requests in flight)."""
    chosen = criteria or list(CRITERIA)
    jobs = [(i, c, r, a_first) for i in range(len(questions)) for c in chosen
            for r in range(1, repeats + 1) for a_first in (True, False)]
    done = 0

    async def one(i: int, criterion: str, repeat: int, a_first: bool) -> Judgment:
        nonlocal done
        first, second = (answers_a[i], answers_b[i]) if a_first else (answers_b[i], answers_a[i])
        prompt = client.prompts.render("judge", criterion=criterion.capitalize(),
                        definition=CRITERIA[criterion], run=repeat, question=questions[i].text,
                        answer1=first, answer2=second)
        try:
            out = await client.json("judge", _user(prompt), JudgeOut)
        except CanopyError as exc:  # unreadable after the repair turn, or the endpoint failed
            winner, reasoning = None, str(exc)[:200]
        else:
            shown = {1: "A" if a_first else "B", 2: "B" if a_first else "A", 0: "tie"}
            winner, reasoning = shown[out.winner], out.reasoning
        done += 1
        if done % 50 == 0 or done == len(jobs):
            progress(f"judge: {done}/{len(jobs)} judgments")
        return Judgment(i, criterion, repeat, a_first, winner, reasoning)

    return list(await asyncio.gather(*(one(*job) for job in jobs)))


# ---- 4. scores ----------------------------------------------------------------------------------


def score(judgments: list[Judgment], *, seed: int = 0) -> list[CriterionScore]:
    """Method A's win rate per criterion (in CRITERIA order) with a 95% bootstrap interval."""
    out = []
    for criterion in [c for c in CRITERIA if any(j.criterion == c for j in judgments)]:
        mine = [j for j in judgments if j.criterion == criterion]
        value = {"A": 1.0, "tie": 0.5, "B": 0.0}
        by_question: dict[int, list[float]] = {}
        for j in mine:
            if j.winner is not None:
                by_question.setdefault(j.question, []).append(value[j.winner])
        per_q = [statistics.fmean(v) for _, v in sorted(by_question.items())]
        firsts = [f for j in mine if (f := j.first_chosen) is not None]
        low, high = _bootstrap(per_q, seed)
        out.append(CriterionScore(
            criterion, len(per_q), sum(j.winner == "A" for j in mine),
            sum(j.winner == "B" for j in mine), sum(j.winner == "tie" for j in mine),
            sum(j.winner is None for j in mine),
            round(statistics.fmean(per_q), 4) if per_q else float("nan"), low, high,
            round(sum(firsts) / len(firsts), 4) if firsts else None, per_q))
    return out


def _bootstrap(values: list[float], seed: int, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (seeded)."""
    if not values:
        return float("nan"), float("nan")
    if len(values) == 1:
        return values[0], values[0]
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(BOOTSTRAP))
    tail = (1 - level) / 2
    return (round(means[int(tail * BOOTSTRAP)], 4),
            round(means[min(BOOTSTRAP - 1, int((1 - tail) * BOOTSTRAP))], 4))

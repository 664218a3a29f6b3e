"""The community report prompt, assembled in one place (Edge et al. 2024 §2.1.5): the report
template (`prompts/report.txt`, or the user's replacement) filled with the context's tables and
the word budget, and the reply's citations kept to rows the context has.

The context itself (which elements, which sub-reports, within which budget) is chosen by
canopy.indexer.operations.report_context; the builtin provider writes from its structure
instead of this text.
"""

from __future__ import annotations

from canopy.prompts import PromptSet
from canopy.providers.base import ReportContext, ReportOut

__all__ = ["report_prompt", "report_tables", "within_context"]


def report_prompt(prompts: PromptSet, ctx: ReportContext, *, max_words: int) -> str:
    """The whole request text of one report."""
    return prompts.render("report", context=report_tables(ctx), max_words=max_words)


def report_tables(ctx: ReportContext) -> str:
    """The context as the LLM reads it: CSV-like tables of reports, entities, relationships and
    claims, each row numbered by its index in the context (what findings cite)."""
    parts: list[str] = []
    if ctx.sub_reports:
        parts.append("-----Reports-----\nid,title,content")
        parts += [f"{i},{r.title},{r.full_text()}" for i, r in enumerate(ctx.sub_reports)]
    parts.append("-----Entities-----\nid,entity,description,degree")
    parts += [f"{i},{e.name},{e.description},{ctx.degrees.get(e.id, e.degree)}"
              for i, e in enumerate(ctx.entities)]
    names = {e.id: e.name for e in ctx.entities}
    if ctx.relationships:
        parts.append("-----Relationships-----\nid,source,target,description,weight")
        parts += [
            f"{i},{names.get(r.source, r.source)},{names.get(r.target, r.target)},"
            f"{r.description},{r.weight:g}"
            for i, r in enumerate(ctx.relationships)
        ]
    if ctx.claims:
        # GraphRAG's covariate columns: the object and the claimed period let a report say
        # who did what to whom, and when.
        parts.append("-----Claims-----\n"
                     "id,subject,object,type,status,start_date,end_date,description")
        parts += [f"{i},{names.get(c.subject, c.subject)},{names.get(c.object, c.object)},"
                  f"{c.type},{c.status},{c.start_date},{c.end_date},{c.description}"
                  for i, c in enumerate(ctx.claims)]
    return "\n".join(parts)


def within_context(out: ReportOut, ctx: ReportContext) -> ReportOut:
    """`out` with each finding citing only rows the context has (each once, in order)."""
    n_ent, n_rel, n_rep = len(ctx.entities), len(ctx.relationships), len(ctx.sub_reports)
    findings = [
        f.model_copy(update={
            "entity_ids": _in_range(f.entity_ids, n_ent),
            "relationship_ids": _in_range(f.relationship_ids, n_rel),
            "report_ids": _in_range(f.report_ids, n_rep),
        })
        for f in out.findings
    ]
    return out.model_copy(update={"findings": findings})


def _in_range(ids: list[int], n: int) -> list[int]:
    return list(dict.fromkeys(i for i in ids if 0 <= i < n))

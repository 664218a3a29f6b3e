"""The index's decisions as pure functions: plain data in, plain data out, no store, no
providers, no settings (each takes the values it needs). The stages (canopy.indexer.stages) read
their input tables, call these and stage what they return, as Microsoft GraphRAG's workflows run
over its operations.

- `chunking`: edit-stable text units of a document.
- `merging`: extraction instances merged into entity and relationship rows.
- `clustering`: hierarchical Leiden over the entity graph, stable community ids, modularity.
- `grouping`: the bound on top-level communities and what joins what under it.
- `hierarchy_update`: the local update of a committed hierarchy (its reads come through a small
  protocol that the store, or a test's dictionaries, provide).
- `staleness`: which communities an update recomputes, and what becomes of each report.
- `report_context`: a report's context within its token budget, and its fingerprint.
- `report_order`: the order reports are written in (deepest level first, in bounded chunks).
"""

"""The GraphRAG wing: Microsoft GraphRAG interop. `export` writes an index as GraphRAG-shaped
Parquet tables (`canopy export`, `export_cli`); `ingest` builds an index from GraphRAG's output
folder (`canopy import-graphrag`, `import_cli`, under the writer lock in `import_index`). Its
extra, [graphrag], adds nothing to the core's dependencies (pyarrow is the core's)."""

"""The exported tables' columns and types, defined once (parquet writes them as they are; CSV
writes list and struct columns as JSON text; GraphML reads entities, relationships and
communities).

Names and order follow Microsoft GraphRAG's output tables (its docs, "Outputs"), so its users
find `entities.parquet`, `relationships.parquet`, ... where they expect them. Canopy's ids are
content hashes rather than UUIDs, and `human_readable_id` numbers the rows of this export. Each
table adds, after GraphRAG's columns, the provenance Canopy keeps: `document_ids` beside every
`text_unit_ids`, and the entity ids behind names that GraphRAG gives by name only.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["FINDING", "IDS", "TABLES"]

IDS = pa.list_(pa.string())
FINDING = pa.struct([
    ("summary", pa.string()),
    ("explanation", pa.string()),
    ("entity_ids", IDS),
    ("relationship_ids", IDS),
    ("text_unit_ids", IDS),
])

_S, _I, _F = pa.string(), pa.int64(), pa.float64()

TABLES: dict[str, pa.Schema] = {
    "documents": pa.schema([
        ("id", _S), ("human_readable_id", _I), ("title", _S),
        ("text", _S),  # the document as loaded, rebuilt from its units' own spans
        ("text_unit_ids", IDS),
        ("metadata", _S),  # front-matter fields as a JSON object ("{}" without any)
        ("path", _S),  # relative to the documents folder, POSIX separators
    ]),
    "text_units": pa.schema([
        ("id", _S), ("human_readable_id", _I),
        ("text", _S),  # with its overlap prefix, as extracted and embedded
        ("n_tokens", _I), ("document_ids", IDS), ("entity_ids", IDS), ("relationship_ids", IDS),
        ("covariate_ids", IDS), ("document_id", _S),
    ]),
    "entities": pa.schema([
        ("id", _S), ("human_readable_id", _I), ("title", _S), ("type", _S), ("description", _S),
        ("text_unit_ids", IDS), ("frequency", _I), ("degree", _I), ("document_ids", IDS),
    ]),
    "relationships": pa.schema([
        ("id", _S), ("human_readable_id", _I),
        ("source", _S), ("target", _S),  # entity titles, as in GraphRAG
        ("description", _S), ("weight", _F), ("combined_degree", _I), ("text_unit_ids", IDS),
        ("source_id", _S), ("target_id", _S), ("document_ids", IDS),
    ]),
    "communities": pa.schema([
        ("id", _S), ("human_readable_id", _I),
        ("community", _I), ("level", _I),
        ("parent", _I),  # -1 for a top-level community
        ("children", pa.list_(_I)), ("title", _S), ("entity_ids", IDS), ("relationship_ids", IDS),
        ("text_unit_ids", IDS), ("size", _I), ("document_ids", IDS),
    ]),
    "community_reports": pa.schema([
        ("id", _S), ("human_readable_id", _I), ("community", _I), ("level", _I), ("parent", _I),
        ("children", pa.list_(_I)), ("title", _S), ("summary", _S), ("full_content", _S),
        ("rank", _F), ("rating_explanation", _S), ("findings", pa.list_(FINDING)),
        ("full_content_json", _S), ("size", _I), ("text_unit_ids", IDS), ("document_ids", IDS),
    ]),
    "covariates": pa.schema([
        ("id", _S), ("human_readable_id", _I), ("covariate_type", _S), ("type", _S),
        ("description", _S),
        ("subject_id", _S), ("object_id", _S),  # entity titles, as in GraphRAG ("" for none)
        ("status", _S), ("start_date", _S), ("end_date", _S), ("source_text", _S),
        ("text_unit_id", _S),
        ("subject_entity_id", _S), ("object_entity_id", _S), ("document_ids", IDS),
    ]),
}

"""Indexing: documents -> text units -> graph -> communities -> reports -> vectors (design §3,
§4)."""

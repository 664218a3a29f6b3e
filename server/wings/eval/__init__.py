"""The evaluation wing: `canopy eval` (`eval_cli`), retrieval scored on questions with gold
documents against a BM25 baseline (`retrieval`), and answers compared by an LLM judge
(`answers`). Its extra, [eval], brings bm25s."""

"""The builtin offline provider and embedder: no model, no network, no keys (design §7).

- `provider`: `BuiltinProvider`, every provider task in the LLM path's schemas;
- `extraction`, `mentions`: entities, relationships and claims found by heuristics;
- `summaries`, `reports`: extractive description summaries and community reports;
- `relevance`: lexical relevance of texts to a query, for the query-time tasks;
- `embedder`: `HashEmbedder`, signed feature hashing of terms;
- `static`: `WordLlamaEmbedder`, static semantic word vectors from the optional wordllama
  package (`[embed] builtin = "wordllama"`; imported only when chosen);
- `text`: the one text-analysis module (words, stems, stop words, sentences, CJK), also used by
  the lexical index and local_search's evidence ranking;
- `lexicon`: the word lists behind them.
"""

from __future__ import annotations

from canopy.providers.builtin.embedder import HashEmbedder
from canopy.providers.builtin.provider import NO_INFORMATION, BuiltinProvider

__all__ = ["NO_INFORMATION", "BuiltinProvider", "HashEmbedder"]

"""Offline token counts are tiktoken's: same vocabulary (hash-checked), same pattern."""

from __future__ import annotations

import bpe_openai
import pytest

from canopy.tokenizer import get_tokenizer
from tests.conftest import carol_text

SAMPLES = [
    "Hello world, 你好世界 Scrooge!",
    "Maria Okafor negotiated the cell supply contract with Helio Cells Ltd for Project Kestrel.",
    "  leading spaces\n\n\ttabs and\r\nCRLF   trailing   ",
    "数字 12345678 and émojis 🌲🌳 and ümlauts",
    "",
]


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_counts_match_an_independent_bpe_implementation(encoding: str) -> None:
    tok = get_tokenizer(encoding)
    other = bpe_openai.get_encoding(encoding)
    for text in [*SAMPLES, carol_text()[:20000]]:
        assert tok.encode(text) == list(other.encode(text))


def test_truncate_and_decode_round_trip() -> None:
    tok = get_tokenizer()
    text = "The quick brown fox jumps over the lazy dog. " * 10
    cut = tok.truncate(text, 12)
    assert tok.count(cut) == 12 and text.startswith(cut)
    assert tok.decode(tok.encode(text)) == text


def test_counts_are_remembered_only_while_an_index_build_runs() -> None:
    tok = get_tokenizer("o200k_base")
    text = "Marley was dead: to begin with. " * 3
    n = tok.count(text)
    assert text not in tok._counts  # a server remembers nothing
    with tok.memoizing():
        with tok.memoizing():  # a watcher's build beside another
            assert tok.count(text) == n and text in tok._counts
        assert text in tok._counts  # the outer build still runs
    assert not tok._counts and tok.count(text) == n


def test_a_tokenizer_pickles_by_name_without_tiktokens_python_ranks() -> None:
    """The Python copy of the vocabulary (26 MB for o200k) is dropped once the encoding is
    built; a Tokenizer still crosses process boundaries (Ray workers) by name."""
    import pickle

    tok = get_tokenizer("cl100k_base")
    assert not hasattr(tok._enc, "_mergeable_ranks")
    again = pickle.loads(pickle.dumps(tok))
    assert again is tok  # the process's own tokenizer for that encoding
    assert again.encode(SAMPLES[1]) == tok.encode(SAMPLES[1])

"""A tiny Llama model as a GGUF file, written at test time with the `gguf` package.

Random weights (seeded), so what it says is nonsense, but everything around the weights is
real: the Llama-2 tokenizer (32,000 SentencePiece-BPE pieces with byte fallback; the copy the
wordllama wheel ships, so nothing is downloaded), BOS/EOS/UNK ids, and a Llama-2 chat template
that llama-cpp-python's server renders with Jinja. The server then does what it does for any
model: tokenizes the prompt, enforces a JSON schema through a grammar, streams, counts tokens,
and stops at max_tokens or the context length.

One thing is not random: the pieces that are only quotes and `</s>` are raised a little (and
whitespace lowered as much), as a trained model favours what closes a string or an answer.
Without it a uniformly random model under a JSON grammar never closes a string (one piece in
32,000 does) and every request runs to the end of the context: 6,000 tokens and 30 s each.
With it (and a sampling temperature of 1) strings are short, lists a few items, text answers
end. How: every token embedding shares one large direction `c`, so the final hidden state
points along `c`, and the output rows of those pieces have `c` added: their logits move by
`BOOST` whatever the context, the others stay small and random.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["CHAT_TEMPLATE", "tokenizer_file", "write_tiny_llama"]

# Llama-2's chat layout: [INST] ... [/INST], the system prompt in <<SYS>> inside the first turn.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}"
    "{% endfor %}")

# The server samples from the 40 likeliest pieces (llama-cpp-python's top_k), which for this
# model are nearly the same 40 everywhere. The boosts put the pieces that are only quotes and
# `</s>` among them and keep whitespace out: most strings end at once or within a few pieces
# (each piece of a string costs the grammar a pass over the vocabulary), a text answer within
# a dozen or two, and the few names recur.
BOOST = 3.0
EOS_BOOST = 1.5
_CLOSERS = ('"',)  # pieces that are only quotes: a string ends within a dozen pieces

# SentencePiece token types, as llama.cpp reads them
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def tokenizer_file() -> Path:
    """The Llama-2 tokenizer (Hugging Face tokenizer.json layout) inside the wordllama wheel."""
    import wordllama

    return Path(wordllama.__file__).parent / "tokenizers" / "l2_supercat_tokenizer_config.json"


def write_tiny_llama(path: Path, *, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                     n_ff: int = 128, n_ctx: int = 8192, seed: int = 0) -> Path:
    """A Llama-architecture GGUF at `path` (about 17 MB: the 32,000 x 64 embeddings twice)."""
    import gguf

    spec = json.loads(tokenizer_file().read_text(encoding="utf-8"))
    vocab: dict[str, int] = spec["model"]["vocab"]
    special = {t["id"] for t in spec["added_tokens"] if t.get("special")}
    tokens = [b""] * len(vocab)
    types = [_NORMAL] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece.encode("utf-8")
        if piece == spec["model"]["unk_token"]:
            types[i] = _UNKNOWN
        elif i in special:
            types[i] = _CONTROL
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            types[i] = _BYTE
    # SentencePiece merges the highest-scoring pair first; the vocabulary is in merge order
    scores = [-float(i) for i in range(len(vocab))]

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("canopy-tiny-llama (random weights)")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(vocab["<s>"])
    writer.add_eos_token_id(vocab["</s>"])
    writer.add_unk_token_id(vocab["<unk>"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    n_vocab = len(vocab)
    direction = np.ones(n_embd, dtype=np.float32) / np.sqrt(n_embd)  # unit vector c
    # 1 per dimension against 0.02 of noise: the RMS-normalized state is about c * sqrt(d)
    embd = weights(n_vocab, n_embd) + np.ones(n_embd, dtype=np.float32)
    writer.add_tensor("token_embd.weight", embd)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weights(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    output = weights(n_vocab, n_embd)
    closers = [i for piece, i in vocab.items()
               if types[i] == _NORMAL and piece.strip("▁") and not piece.strip("▁\"")]
    output[closers] += direction * (BOOST / np.sqrt(n_embd))  # c . (c * sqrt(d)) = sqrt(d)
    output[vocab["</s>"]] += direction * (EOS_BOOST / np.sqrt(n_embd))
    # Whitespace between JSON tokens is lowered as much: runs of it multiply the grammar's
    # stacks (llama.cpp's JSON `ws` rule), and one request took 550 ms a token
    blank = [i for piece, i in vocab.items() if types[i] == _NORMAL and not piece.strip("▁ ")]
    blank += [vocab[f"<0x{b:02X}>"] for b in (0x09, 0x0A, 0x0D, 0x20)]
    output[blank] -= direction * (BOOST / np.sqrt(n_embd))
    writer.add_tensor("output.weight", output)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

"""A real OpenAI-compatible inference server for the heavy tests: llama-cpp-python's server on
a tiny model made at test time (random weights, a real tokenizer and chat template)."""

"""Speculative decoding (vLLM v1's `vllm/v1/spec_decode/` in a small form).

- `config`: the `speculative=` string ("ngram:k=4", "draft:MODEL:k=4") parsed and validated.
- `ngram`: prompt-lookup proposals, no extra model (torch-free).
- `draft`: a smaller model of the same vocabulary, run by its own model runner over the target's block
  tables with its own paged KV cache.
- `proposer`: the interface (room for EAGLE / MTP heads).
- `adaptive`: each sequence's k from its acceptance and the measured cost of verify steps (torch-free).
- `rejection_sampler`: verification, lossless for greedy and sampled rows.
- `speculator`: the hook the engine's step calls; `metrics`: the counters `/metrics` exports.
"""

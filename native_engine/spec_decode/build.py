"""Builds an engine's `Speculator` from its `SpeculativeConfig`."""

from __future__ import annotations

from .config import SpeculativeConfig
from .ngram import NgramProposer
from .proposer import NgramSource
from .speculator import Speculator

DEFAULT_K = 4  # drafts per verify row when a request turns speculation on for an engine without a method


def default_config() -> SpeculativeConfig:
    return SpeculativeConfig("ngram", DEFAULT_K)


def load_draft(config: SpeculativeConfig | None, engine_config, device, dtype, vocab_size: int):
    """The draft model's runner (weights only) for a "draft:" config, else None."""
    if config is None or config.method != "draft":
        return None
    from .draft import DraftModelProposer  # torch: only for a draft model

    return DraftModelProposer.load(config.draft_model, engine_config, device, dtype, vocab_size, config.draft_layers)


def speculator(config: SpeculativeConfig, engine, draft=None) -> Speculator:
    """engine: the `LLMEngine`; draft: `load_draft`'s result, given its KV cache here (the target's block
    count: the two caches share the block tables)."""
    if draft is not None:
        draft.attach(engine.model_runner.num_kvcache_blocks, engine.max_model_len)
        return Speculator(config, draft)
    proposer = NgramSource(NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                                         config.prompt_lookup_max))
    return Speculator(config, proposer)

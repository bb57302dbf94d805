"""Builds an engine's `Speculator` from its `SpeculativeConfig`."""

from __future__ import annotations

from .config import SpeculativeConfig
from .ngram import NgramProposer
from .proposer import NgramSource
from .speculator import Speculator

DEFAULT_K = 4  # drafts per verify row when a request turns speculation on for an engine without a method


def default_config() -> SpeculativeConfig:
    return SpeculativeConfig("ngram", DEFAULT_K)


def speculator(config: SpeculativeConfig, engine) -> Speculator:
    """engine: the `LLMEngine` (a draft model shares its block manager and reads its device and dtype)."""
    if config.method == "ngram":
        proposer = NgramSource(NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                                             config.prompt_lookup_max))
    else:
        from .draft import DraftModelProposer  # torch: only for a draft model

        proposer = DraftModelProposer.build(config, engine)
    return Speculator(config, proposer)

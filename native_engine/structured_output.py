"""Structured outputs: JSON schemas, any JSON object, regexes, choices and Lark grammars as token bitmasks.

The grammar engine is llguidance (vLLM's `guidance` backend, SGLang's `llguidance`): a Rust library with
no Python dependencies and one abi3 wheel for every CPython >= 3.9, that compiles a JSON schema lazily and
computes a step's mask in tens of microseconds. Each constrained sequence owns an `LLMatcher`; per step the
manager fills the masks of the constrained rows into a host buffer (pinned on CUDA; llguidance drops the GIL;
on CUDA its threads fill the rows in parallel), the buffer goes to the device with a non-blocking copy, and the sampler
sets the disallowed logits to -inf there (`sample.ops.apply_token_bitmask`). The model runner asks for the
masks after it has launched the step's forward, so on a GPU they are computed while the forward runs.
When a grammar is complete the mask allows only EOS, which finishes the sequence.

llguidance is imported on the first constrained request: an engine that never sees one never loads it.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache

import numpy as np
import torch

from .sampling_params import SamplingParams, StructuredOutputsParams

log = logging.getLogger(__name__)
# Compact JSON: no free whitespace, so a small model cannot spend its tokens on blank lines.
_JSON_OPTIONS = {"whitespace_flexible": False}


def _llguidance():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - an install without the dependency
        raise ValueError("structured outputs need the llguidance package (pip install llguidance)") from None
    return llguidance


def grammar_of(spec: StructuredOutputsParams) -> str:
    """llguidance's grammar text for a request (raises ValueError on a malformed schema)."""
    lg = _llguidance()
    if spec.json_object:
        return _json_grammar('{"type": "object"}')
    if spec.json is not None:
        text = spec.json if isinstance(spec.json, str) else json.dumps(spec.json)  # property order kept
        return _json_grammar(text)
    if spec.regex is not None:
        return lg.LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        return lg.grammar_from("choice", json.dumps(list(spec.choice)))
    return lg.LLMatcher.grammar_from_lark(spec.grammar)


@lru_cache(maxsize=256)
def _json_grammar(schema: str) -> str:
    return _llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)


class _TokenizerWrapper:
    """llguidance's tokenizer protocol over the engine's tokenizer (its `TokenizerWrapper`'s fields)."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(vocab_size)]
        self.special_token_ids = [i for i in range(vocab_size) if tokenizer.is_special(i)]
        self.is_tokenizer_wrapper = True

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, parse_special=False)


class StructuredOutputManager:
    def __init__(self, tokenizer, vocab_size: int, device: torch.device) -> None:
        self.tokenizer, self.vocab_size, self.device = tokenizer, vocab_size, device
        self.words = (vocab_size + 31) // 32  # int32 words of one row's bitmask
        self.matchers: dict[tuple[str, int], object] = {}
        self._lltokenizer = None
        self._executor = None
        self._host = torch.empty(0, self.words, dtype=torch.int32)

    def _tokenizer(self):
        if self._lltokenizer is None:
            lg = _llguidance()
            wrapper = _TokenizerWrapper(self.tokenizer, self.vocab_size)
            self._lltokenizer = lg.LLTokenizer(wrapper, n_vocab=self.vocab_size,
                                               eos_token=list(self.tokenizer.eos_token_ids))
            self._executor = lg.LLExecutor() if self.device.type != "cpu" else None
        return self._lltokenizer

    def validate(self, params: SamplingParams) -> None:
        """Compile the request's grammar once at admission: a bad schema is the request's error (ValueError)."""
        if params.structured_outputs is None:
            return
        try:
            grammar = grammar_of(params.structured_outputs)
        except ValueError as exc:
            raise ValueError(f"invalid structured output (format): {exc}") from None
        error = _llguidance().LLMatcher.validate_grammar(grammar, self._tokenizer())
        if error and not error.startswith("WARNING"):
            raise ValueError(f"invalid structured output (format): {error}")

    def _matcher(self, key: tuple[str, int], spec: StructuredOutputsParams):
        matcher = self.matchers.get(key)
        if matcher is None:
            matcher = _llguidance().LLMatcher(self._tokenizer(), grammar_of(spec), log_level=0)
            self.matchers[key] = matcher
        return matcher

    def bitmask(self, rows: list[tuple[tuple[str, int], SamplingParams]]
                ) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """(row indices [G] or None for every row, bitmask [G, words] on the device) for the constrained
        rows; None when no row has a grammar."""
        constrained = [(i, self._matcher(key, p.structured_outputs)) for i, (key, p) in enumerate(rows)
                       if p.structured_outputs is not None]
        if not constrained:
            return None
        host = self._buffer(len(constrained))
        if self.device.type == "cpu":  # serially: the engine's threads hold the cores (~1.5 us a row)
            for j, (_, matcher) in enumerate(constrained):
                matcher.unsafe_compute_mask_ptr(host[j].data_ptr(), self.words * 4)
        else:  # in parallel, on llguidance's threads, while the GPU runs the forward
            self._executor.unsafe_compute_mask_ptr([(m, j) for j, (_, m) in enumerate(constrained)],
                                                   host.data_ptr(), self.words * 4, len(constrained))
        bitmask = host.to(self.device, non_blocking=True)
        if len(constrained) == len(rows):
            return None, bitmask
        index = torch.from_numpy(np.array([i for i, _ in constrained], dtype=np.int64))
        return index.to(self.device, non_blocking=True), bitmask

    def _buffer(self, n: int) -> torch.Tensor:
        if self._host.shape[0] < n:
            size = max(n, 2 * self._host.shape[0], 8)
            self._host = torch.empty(size, self.words, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        return self._host[:n]

    def accept(self, rows: list[tuple[tuple[str, int], SamplingParams]], token_ids: list[int]) -> None:
        """Advance each constrained row's matcher by its sampled token."""
        for (key, params), token in zip(rows, token_ids, strict=True):
            if params.structured_outputs is not None and not self.matchers[key].consume_token(token):
                log.warning("structured output %s: token %d rejected: %s", key, token, self.matchers[key].get_error())

    def release(self, key: tuple[str, int]) -> None:
        self.matchers.pop(key, None)

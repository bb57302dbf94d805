"""Sampling and runtime options, with Ollama's names, defaults and precedence.

Precedence: built-in defaults < the model's params layer < request options. ``resolve_options``
applies it and validates the result; unknown keys are ignored (as Ollama does) and returned so the
caller can log them.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .settings import DEFAULTS, check_speculative
from .errors import ContextLengthExceeded, InvalidRequest

log = logging.getLogger(__name__)

# Options that decide how the model is loaded; changing one reloads the model.
LOAD_OPTIONS = ("num_ctx", "num_batch", "num_thread", "num_gpu", "use_mmap", "tensor_parallel")


class Options(BaseModel):
    """One request's effective options. Field names are Ollama's ``options`` keys."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    seed: int = Field(default=-1, ge=-(1 << 63), le=(1 << 64) - 1, description="Sampling seed; negative picks a random one.")
    num_predict: int = Field(default=-1, ge=-2, le=(1 << 31) - 1,
                             description="Max tokens to generate; -1 = until stop or context end.")
    num_keep: int = Field(default=4, ge=0, le=1 << 20)
    top_k: int = Field(default=40, ge=0, le=1 << 20)
    top_p: float = Field(default=0.9, ge=0.0, le=1.0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    typical_p: float = Field(default=1.0, ge=0.0, le=1.0)
    temperature: float = Field(default=0.8, ge=0.0, le=100.0)
    repeat_penalty: float = Field(default=1.0, ge=0.0, le=100.0)
    repeat_last_n: int = Field(default=64, ge=-1, le=1 << 20, description="0 = off, -1 = num_ctx.")
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: tuple[str, ...] = Field(default=(), description="Stop strings; generation ends before them.")
    ignore_eos: bool = Field(default=False, description="Keep generating past end-of-sequence tokens "
                             "(vLLM's flag, for benchmarks and tests that need an exact length).")
    num_ctx: int = Field(default=DEFAULTS.context_length, ge=16, le=1 << 20,
                         description="Context window in tokens (load time).")
    num_batch: int = Field(default=512, ge=1, le=1 << 20)
    num_thread: int = Field(default=0, ge=0, le=512, description="0 = llama.cpp's choice (512: ggml's most).")
    num_gpu: int = Field(default=-1, ge=-1, le=1 << 16)
    use_mmap: bool = True
    tensor_parallel: int = Field(default=DEFAULTS.tensor_parallel, ge=1, le=64,
                                 description="Processes the native engine splits the model over (load time; "
                                 "tensor parallelism, one rank per process: gloo on CPU, NCCL on CUDA).")
    speculative: bool | str | None = Field(
        default=None, description="Speculative decoding (native engine): a method for the model (ngram:k=4, "
        "draft:MODEL:k=4, as a Modelfile PARAMETER), or true/false to turn it on/off for one request.")

    @field_validator("speculative", mode="before")
    @classmethod
    def _speculative(cls, value: Any) -> Any:
        return check_speculative(value)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        """One string or a list; empty strings are dropped (they would stop before every token)."""
        if value is None:
            return ()
        if isinstance(value, str):
            value = (value,)
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(v for v in value if v != "")
        raise ValueError(f"must be a string or a list of strings, got {value!r}"[:200])

    def sampling_seed(self) -> int:
        """A 32-bit seed (llama.cpp's): the seed's low 32 bits, or a random one for a negative seed."""
        return self.seed % (1 << 32) if self.seed >= 0 else random.randrange(1 << 31)

    def load_key(self) -> tuple:
        return tuple(getattr(self, name) for name in LOAD_OPTIONS)


KNOWN = frozenset(Options.model_fields)


def resolve_options(*layers: dict[str, Any] | None, defaults: dict[str, Any] | None = None) -> Options:
    """Merge option dicts left to right over the built-in defaults and validate.

    ``defaults`` overrides the built-ins (server settings such as ``INFER_CONTEXT_LENGTH``).
    Raises :class:`InvalidRequest` naming the first bad option.
    """
    merged: dict[str, Any] = dict(defaults or {})
    for layer in layers:
        for key, value in (layer or {}).items():
            if key not in KNOWN:
                log.info("ignoring unknown option %r", key)
                continue
            if value is not None:
                merged[key] = value
    try:
        return Options(**merged)
    except ValidationError as exc:
        name, message = _first_error(exc, "options")
        raise InvalidRequest(f"invalid option '{name}': {message}", param=f"options.{name}") from None


def check_parameters(params: dict[str, Any]) -> None:
    """A model's params layer (a Modelfile's PARAMETERs, ``/api/create``'s ``parameters``) checked
    against the same ranges as a request's options, before the model is written; ValueError naming
    the parameter."""
    try:
        Options(**{k: v for k, v in params.items() if k in KNOWN})
    except ValidationError as exc:
        name, message = _first_error(exc, "parameters")
        raise ValueError(f"invalid parameter '{name}': {message}") from None


def _first_error(exc: ValidationError, where: str) -> tuple[str, str]:
    """The first error's field (a list's index left out) and its message, without pydantic's prefix."""
    err = exc.errors()[0]
    name = str(err["loc"][0]) if err["loc"] else where
    return name, err["msg"].removeprefix("Value error, ")


def check_prompt_bytes(text: str, n_ctx: int, max_token_bytes: int) -> None:
    """Refuse at once a prompt too long to fit however it tokenizes: each token covers at most
    ``max_token_bytes`` bytes (the model's longest vocabulary entry), so a prompt of more than
    ``n_ctx * max_token_bytes`` bytes has more than ``n_ctx`` tokens. Bounded work before the
    tokenizer sees a megabyte-sized prompt."""
    limit = n_ctx * max(1, max_token_bytes)
    if len(text) > limit and len(text.encode("utf-8", "replace")) > limit:
        raise ContextLengthExceeded(len(text.encode("utf-8", "replace")) // max(1, max_token_bytes), n_ctx,
                                    estimated=True)


def check_room(n_prompt: int, n_ctx: int, num_predict: int, *, strict: bool) -> None:
    """A prompt must leave room in the window; ``strict`` (OpenAI's max_tokens) also checks the answer's room."""
    if n_prompt == 0:  # nothing to decode (llama.cpp fails on it): e.g. a template that rendered nothing
        raise InvalidRequest("the prompt is empty after applying the template; send text, or a template "
                             "that renders the prompt", param="prompt")
    if n_prompt >= n_ctx:
        raise ContextLengthExceeded(n_prompt, n_ctx)
    if strict and num_predict > 0 and n_prompt + num_predict > n_ctx:
        raise InvalidRequest(
            f"max_tokens is too large: the context window is {n_ctx} tokens and the prompt uses "
            f"{n_prompt}, so at most {n_ctx - n_prompt} tokens can be generated", param="max_tokens")


def check_token_ids(token_ids: list[int], n_vocab: int, param: str = "prompt") -> list[int]:
    """``token_ids`` (a prompt or input given as ids) when every id is in the vocabulary; 400 otherwise."""
    bad = next((t for t in token_ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise InvalidRequest(f"token id {bad} is not in the model's vocabulary of {n_vocab} tokens", param=param)
    return list(token_ids)

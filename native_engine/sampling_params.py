"""Per-request sampling options (vLLM names), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

_SAMPLING_EPS = 1e-5


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """Constrain the output (vLLM's `StructuredOutputsParams`); exactly one field is set.

    `json`: a JSON schema (dict or its text); `json_object`: any JSON object (Ollama's `format: "json"`,
    OpenAI's `json_object`); `regex`; `choice`: one of these strings; `grammar`: a Lark grammar in
    llguidance's syntax."""

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [self.json is not None, self.json_object, self.regex is not None, self.choice is not None,
                 self.grammar is not None]
        _check(sum(given) == 1, "structured_outputs needs exactly one of json, json_object, regex, choice, grammar")
        _check(self.json is None or isinstance(self.json, (dict, str)), "structured_outputs.json must be a dict or str")
        _check(self.choice is None or all(isinstance(c, str) for c in self.choice),
               "structured_outputs.choice must hold strings")


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False  # not for structured outputs: a complete grammar allows only EOS, which ends it
    logprobs: int | None = None  # top-k count; 0 = only the sampled token's logprob
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    speculative: bool | None = None  # speculative decoding for this request: None = the engine's setting
    # Prefill/decode disaggregation (kv_transfer.py): vLLM's ``kv_transfer_params`` of the request.
    kv_transfer_params: dict | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self._check_counts()
        self._check_probabilities()
        self._check_penalties()
        self._check_stops()
        _check(self.speculative is None or isinstance(self.speculative, bool),
               f"speculative must be true, false or None, got {self.speculative!r}")
        _check(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
               f"structured_outputs must be a StructuredOutputsParams, got {self.structured_outputs!r}")

    def _check_counts(self) -> None:
        _check(_is_int(self.n) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}")
        _check(
            _is_int(self.max_tokens) and self.max_tokens >= 1,
            f"max_tokens must be an integer >= 1, got {self.max_tokens!r}",
        )
        _check(
            _is_int(self.top_k) and self.top_k >= -1,
            f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}",
        )
        _check(self.seed is None or _is_int(self.seed), f"seed must be an integer or None, got {self.seed!r}")
        _check(
            self.logprobs is None or (_is_int(self.logprobs) and self.logprobs >= 0),
            f"logprobs must be None or an integer >= 0, got {self.logprobs!r}",
        )

    def _check_probabilities(self) -> None:
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")

    def _check_penalties(self) -> None:
        _check(self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _check(-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        _check(-2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")

    def _check_stops(self) -> None:
        _check(all(isinstance(s, str) and s for s in self.stop), f"stop must hold non-empty strings, got {self.stop!r}")
        _check(
            all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
            f"stop_token_ids must hold integers >= 0, got {self.stop_token_ids!r}",
        )

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

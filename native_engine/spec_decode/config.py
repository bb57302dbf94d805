"""`speculative=` strings, parsed into a frozen `SpeculativeConfig` (torch-free).

    "ngram"                      prompt lookup, k = 4, n-grams of 1..3 tokens (vLLM's `ngram` method)
    "ngram:k=6,min=2,max=4"      k draft tokens at most, n-grams of min..max tokens
    "draft:MODEL:k=4"            a smaller model of the same vocabulary (a .gguf path, an HF directory or a
                                 store name resolved by the caller) proposes k tokens
    "draft:MODEL:k=4,layers=8"   only MODEL's first 8 layers (with its final norm and LM head): with the
                                 target itself as MODEL, self-speculation (LayerSkip's draft, without its
                                 training)
    "...,adaptive=off"           always propose k (benchmarks of the mechanism; the default adapts k)
    "off" / ""                   no speculation

`k` is the most draft tokens a sequence verifies per step; with `adaptive` on (the default) each sequence's
k follows its recent acceptance and the measured cost of the verify step, down to 0 (off)."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft")
MAX_K = 16


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str  # "ngram" | "draft" (EAGLE / MTP heads would be further methods)
    num_speculative_tokens: int = 4  # k
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    draft_model: str | None = None
    draft_layers: int | None = None  # the draft model's first N layers only
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= MAX_K:
            raise ValueError(f"speculative k must be in 1..{MAX_K}, got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(f"speculative n-gram sizes need 1 <= min <= max, got {self.prompt_lookup_min}"
                             f" and {self.prompt_lookup_max}")
        if (self.method == "draft") != bool(self.draft_model):
            raise ValueError("speculative 'draft' needs a model (draft:MODEL:k=4); 'ngram' takes none")
        if self.draft_layers is not None and (self.method != "draft" or self.draft_layers < 1):
            raise ValueError(f"speculative layers= needs a draft model and a count >= 1, got {self.draft_layers}")

    @classmethod
    def parse(cls, text: str | None) -> SpeculativeConfig | None:
        """`None` for None, "", "off", "none", "false"; else the config, or ValueError with what is wrong."""
        text = (text or "").strip()
        if text.lower() in ("", "off", "none", "false", "0"):
            return None
        method, _, rest = text.partition(":")
        method = method.strip().lower()
        model = None
        if method == "draft":
            model, _, rest = _split_model(rest)
        return cls(method, draft_model=model, **_options(rest, text))

    def describe(self) -> str:
        """The config back as a `speculative=` string."""
        head = f"draft:{self.draft_model}" if self.method == "draft" else "ngram"
        opts = f"k={self.num_speculative_tokens}"
        if self.draft_layers is not None:
            opts += f",layers={self.draft_layers}"
        if self.method == "ngram":
            opts += f",min={self.prompt_lookup_min},max={self.prompt_lookup_max}"
        return f"{head}:{opts}" + ("" if self.adaptive else ",adaptive=off")


def _split_model(rest: str) -> tuple[str, str, str]:
    """MODEL may hold ':' (a tag: smollm2:135m), so the options are the part after the last ':' when it
    holds '='."""
    head, sep, tail = rest.rpartition(":")
    if sep and "=" in tail:
        return head, sep, tail
    return rest, "", ""


_KEYS = {"k": "num_speculative_tokens", "num_speculative_tokens": "num_speculative_tokens",
         "min": "prompt_lookup_min", "prompt_lookup_min": "prompt_lookup_min",
         "max": "prompt_lookup_max", "prompt_lookup_max": "prompt_lookup_max", "adaptive": "adaptive",
         "layers": "draft_layers"}


def _options(rest: str, text: str) -> dict:
    out: dict = {}
    for part in filter(None, (p.strip() for p in rest.replace(";", ",").split(","))):
        key, sep, value = part.partition("=")
        field = _KEYS.get(key.strip().lower())
        if not sep or field is None:
            raise ValueError(f"speculative {text!r}: unknown option {part!r} (k=, min=, max=, layers=, adaptive=)")
        out[field] = _value(field, value.strip(), text)
    return out


def _value(field: str, value: str, text: str) -> int | bool:
    if field == "adaptive":
        if value.lower() not in ("on", "off", "true", "false", "1", "0"):
            raise ValueError(f"speculative {text!r}: adaptive must be on or off, got {value!r}")
        return value.lower() in ("on", "true", "1")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"speculative {text!r}: {field} must be an integer, got {value!r}") from None

"""Model shapes for deterministic test models, and the named presets."""

from __future__ import annotations

from dataclasses import dataclass, replace

ARCHITECTURES = ("qwen2", "llama")


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer in the Qwen2/Llama family.

    ``vocab_size`` is the embedding row count. The trained tokenizer has at
    most ``tokenizer_vocab_size`` entries; any remaining rows get
    ``<|extra_N|>`` placeholder tokens so every row has a token.
    """

    arch: str = "qwen2"
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    context_length: int = 512
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = True
    qkv_bias: bool = True
    name: str = "tiny-qwen2"
    tokenizer_vocab_size: int = 1000
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for problem in _problems(self):
            raise ValueError(f"invalid model spec {self.name!r}: {problem}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def trained_vocab_size(self) -> int:
        """Vocab size asked of the tokenizer trainer for this spec."""
        return min(self.vocab_size, self.tokenizer_vocab_size)

    def with_(self, **changes: object) -> ModelSpec:
        """Copy with some fields changed (validated again)."""
        return replace(self, **changes)


def _problems(spec: ModelSpec) -> list[str]:
    checks = [
        (spec.arch in ARCHITECTURES, f"arch must be one of {', '.join(ARCHITECTURES)}, got {spec.arch!r}"),
        (spec.num_heads > 0 and spec.hidden_size % spec.num_heads == 0, "hidden_size must be divisible by num_heads"),
        (spec.num_heads > 0 and spec.head_dim % 2 == 0, "head_dim (hidden_size / num_heads) must be even for RoPE"),
        (
            spec.num_kv_heads > 0 and spec.num_heads % spec.num_kv_heads == 0,
            "num_heads must be a multiple of num_kv_heads",
        ),
        (min(spec.num_layers, spec.intermediate_size, spec.context_length) > 0, "sizes must be positive"),
        (spec.vocab_size >= 259, "vocab_size must be at least 259 (256 bytes + 3 special tokens)"),
        (spec.tokenizer_vocab_size >= 259, "tokenizer_vocab_size must be at least 259"),
        (spec.arch != "qwen2" or spec.qkv_bias, "qwen2 always has q/k/v biases (qkv_bias=True)"),
        (spec.arch != "llama" or not spec.qkv_bias, "llama has no q/k/v biases (qkv_bias=False)"),
        (spec.init_std > 0 and spec.rms_eps > 0 and spec.rope_theta > 0, "init_std, rms_eps, rope_theta must be > 0"),
    ]
    return [message for ok, message in checks if not ok]


PRESETS: dict[str, ModelSpec] = {
    "tiny-qwen2": ModelSpec(name="tiny-qwen2"),
    "tiny-llama": ModelSpec(
        name="tiny-llama",
        arch="llama",
        num_kv_heads=4,
        rope_theta=10_000.0,
        rms_eps=1e-5,
        tie_embeddings=False,
        qkv_bias=False,
    ),
    # vLLM's CPU attention takes head sizes of 32 and up: the tiny model with 64-wide heads and a
    # 4096-token context (tests/remote/vllm_server.py serves it with --max-model-len 2048).
    "tiny-qwen2-vllm": ModelSpec(name="tiny-qwen2-vllm", hidden_size=128, intermediate_size=256, num_heads=2,
                                 num_kv_heads=1, context_length=4096),
    # Real Qwen2-0.5B shapes (benchmarks only: ~0.5 B parameters).
    "qwen2-0.5b": ModelSpec(
        name="qwen2-0.5b",
        vocab_size=151_936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        context_length=32_768,
    ),
    "qwen2-7b": ModelSpec(  # bench/native_gpu.py only: its weights are drawn on the device, never written
        name="qwen2-7b",
        vocab_size=152_064,
        hidden_size=3584,
        intermediate_size=18_944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        context_length=32_768,
        tie_embeddings=False,
    ),
}

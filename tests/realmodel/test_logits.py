"""The native engine's logits on SmolLM2 against transformers on the same dequantized weights.

The reference is transformers' `LlamaForCausalLM` in float32 holding the GGUF's tensors dequantized
by gguf-py (llama.cpp's reference dequantizer). The exact f32 path must match it to KL < 1e-9 per
position; the default CPU path (compact weights, quantized matmuls) is held to the issue's accuracy
goal: mean KL < 1e-3 and the same greedy answer as the f32 path. The prompt is the model's own chat
template (its default system message included), on which llama.cpp's 8-bit activations derail.
"""

from __future__ import annotations

import pytest
import torch

from native_engine import LLMEngine, SamplingParams
from native_engine.loader import load_gguf

pytestmark = pytest.mark.realmodel
PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
TEXT = (PROMPT + "The capital of France is Paris. It is known for the Eiffel Tower, the Louvre and its cafés; "
        "about two million people live in the city itself.")


def kl_per_position(reference: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
    ref, mine = reference.double().log_softmax(-1), ours.double().log_softmax(-1)
    return (ref.exp() * (ref - mine)).sum(-1)


def engine(path, **kwargs) -> LLMEngine:
    return LLMEngine.from_model(path, max_num_seqs=4, max_model_len=1024, kv_cache_memory_bytes=32 << 20, **kwargs)


@pytest.fixture(scope="module")
def f32_engine(smollm2_gguf) -> LLMEngine:
    return engine(smollm2_gguf, dtype="float32", cpu_int4_matmul=False)


@pytest.fixture(scope="module")
def token_ids(f32_engine) -> list[int]:
    return f32_engine.tokenizer.encode(TEXT, add_bos=False)


@pytest.fixture(scope="module")
def reference_logits(smollm2_gguf, token_ids) -> torch.Tensor:
    from transformers import LlamaConfig, LlamaForCausalLM

    config, weights = load_gguf(smollm2_gguf, torch.float32)
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta, max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings, torch_dtype=torch.float32)).eval()
    missing, unexpected = hf.load_state_dict(dict(weights), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    hf.tie_weights()
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0].float()


def test_f32_path_matches_transformers(f32_engine, token_ids, reference_logits):
    kl = kl_per_position(reference_logits, f32_engine.model_runner.score(token_ids))
    assert kl.max() < 1e-9, f"max KL {kl.max():.3g} at position {int(kl.argmax())}"


def test_default_path_is_within_the_accuracy_goal(smollm2_gguf, f32_engine, token_ids, reference_logits):
    default = engine(smollm2_gguf)
    kl = kl_per_position(reference_logits, default.model_runner.score(token_ids))
    assert kl.mean() < 1e-3, f"mean KL {kl.mean():.3g}, max {kl.max():.3g}"
    prompt = f32_engine.tokenizer.encode(PROMPT, add_bos=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    answers = [e.generate([prompt], greedy)[0].outputs[0].text for e in (f32_engine, default)]
    assert "Paris" in answers[0] and answers[1] == answers[0]


def test_decode_steps_in_one_c_call_match_the_module_path(smollm2_gguf, f32_engine):
    from native_engine.kernels import cpu_kernels

    if cpu_kernels.library() is None:
        pytest.skip("no C compiler: decode runs through the modules")
    in_c, by_modules = engine(smollm2_gguf), engine(smollm2_gguf)  # fresh ones: the same schedule, no prefix hits
    assert in_c.model_runner.model.model.cpu_decode is not None
    by_modules.model_runner.model.model.cpu_decode = None
    prompts = [f32_engine.tokenizer.encode(PROMPT, add_bos=False), f32_engine.tokenizer.encode(TEXT, add_bos=False)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = [[o.outputs[0].token_ids for o in e.generate(prompts, greedy)] for e in (in_c, by_modules)]
    assert outputs[0] == outputs[1]


def test_batched_decode_steps_match_the_module_path_and_the_f32_answers(smollm2_gguf, f32_engine):
    from native_engine.kernels import cpu_batch

    if cpu_batch.library() is None:
        pytest.skip("no AVX512-VNNI build: batches use the float32 kernels")
    in_c, by_modules = (LLMEngine.from_model(smollm2_gguf, max_num_seqs=8, max_model_len=1024,
                                             kv_cache_memory_bytes=64 << 20) for _ in range(2))
    assert in_c.model_runner.model.model.cpu_decode.batch_pointers is not None
    by_modules.model_runner.model.model.cpu_decode = None
    chat = f32_engine.tokenizer.encode(PROMPT, add_bos=False)
    prompts = [chat] + [f32_engine.tokenizer.encode(TEXT, add_bos=False)[: 20 + 9 * i] for i in range(5)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = [[o.outputs[0].token_ids for o in e.generate(prompts, greedy)] for e in (in_c, by_modules)]
    assert outputs[0] == outputs[1]  # decode batches of 6 rows: tiled int16 matmuls, grouped attention
    assert outputs[0][0] == f32_engine.generate([chat], greedy)[0].outputs[0].token_ids


def test_without_a_c_compiler_the_int4_fallback_keeps_the_goal(smollm2_gguf, f32_engine, token_ids,
                                                                 reference_logits, monkeypatch):
    from native_engine.kernels import cpu_kernels
    from native_engine.layers.quant import Int4Weight

    monkeypatch.setenv("INFER_NO_CPU_KERNELS", "1")
    cpu_kernels.library.cache_clear()
    try:
        fallback = engine(smollm2_gguf)
        assert fallback.model_runner.model.model.cpu_decode is None
        assert isinstance(fallback.model_runner.model.model.layers[0].mlp.down_proj.int4, Int4Weight)
        kl = kl_per_position(reference_logits, fallback.model_runner.score(token_ids))
        prompt = f32_engine.tokenizer.encode(PROMPT, add_bos=False)
        greedy = SamplingParams(temperature=0.0, max_tokens=24)
        answers = [e.generate([prompt], greedy)[0].outputs[0].text for e in (f32_engine, fallback)]
    finally:
        cpu_kernels.library.cache_clear()
    assert kl.mean() < 1e-3, f"mean KL {kl.mean():.3g}, max {kl.max():.3g}"
    assert answers[1] == answers[0]

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


def test_bf16_prefill_is_within_its_bound(smollm2_gguf, f32_engine, token_ids, reference_logits):
    """`cpu_bf16_prefill` (AMX / AVX512-BF16; f32 where the CPU cannot prove it): measured mean KL 4.8e-4,
    max 9.5e-3 on this prompt; held to the issue's mean < 1e-3, max < 2e-2 and the f32 path's greedy answer."""
    bf16 = engine(smollm2_gguf, cpu_bf16_prefill=True)
    kl = kl_per_position(reference_logits, bf16.model_runner.score(token_ids))
    assert kl.mean() < 1e-3 and kl.max() < 2e-2, f"mean KL {kl.mean():.3g}, max {kl.max():.3g}"
    prompt = f32_engine.tokenizer.encode(PROMPT, add_bos=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    answers = [e.generate([prompt], greedy)[0].outputs[0].text for e in (f32_engine, bf16)]
    assert answers[1] == answers[0]


def forced_logits(engine: LLMEngine, prompts: list[list[int]], paths: list[list[int]]) -> torch.Tensor:
    """The logits each step computes while the engine is fed `paths` (one token path per prompt) instead of
    its own choices: two numerically different paths compared on the same tokens. -> [steps, rows, V]"""
    captured, sampler = [], engine.model_runner.sampler

    def forced(logits, meta):
        captured.append(logits.clone())
        out = sampler(logits, meta)
        out.token_ids.copy_(torch.tensor([p[len(captured) - 1] for p in paths]))
        return out

    engine.model_runner.sampler = forced
    try:
        engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=len(paths[0]), ignore_eos=True))
    finally:
        engine.model_runner.sampler = sampler
    return torch.stack(captured)


def assert_same_distributions(reference: torch.Tensor, ours: torch.Tensor, mean_kl: float, max_kl: float) -> None:
    """KL per step and row within bounds; where the greedy tokens differ, only at a near-tie (top-2 logits
    within 0.05 of each other): tokens are not compared across numerically different paths."""
    kl = kl_per_position(reference.flatten(0, 1), ours.flatten(0, 1))
    assert kl.mean() < mean_kl and kl.max() < max_kl, f"mean KL {kl.mean():.3g}, max {kl.max():.3g}"
    ref, mine = reference.flatten(0, 1), ours.flatten(0, 1)
    for i in (ref.argmax(-1) != mine.argmax(-1)).nonzero().flatten().tolist():
        top2 = ref[i].topk(2).values
        assert top2[0] - top2[1] < 0.05, f"step/row {i}: argmax differs with a margin of {top2[0] - top2[1]:.3f}"


def test_decode_steps_in_one_c_call_match_the_module_path(smollm2_gguf, f32_engine):
    from native_engine.kernels import cpu_kernels

    if cpu_kernels.library() is None:
        pytest.skip("no C compiler: decode runs through the modules")
    in_c, by_modules = engine(smollm2_gguf), engine(smollm2_gguf)  # fresh ones: the same schedule, no prefix hits
    assert in_c.model_runner.model.model.cpu_decode is not None
    by_modules.model_runner.model.model.cpu_decode = None
    prompts = [f32_engine.tokenizer.encode(PROMPT, add_bos=False), f32_engine.tokenizer.encode(TEXT, add_bos=False)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    paths = [o.outputs[0].token_ids for o in in_c.generate(prompts, greedy)]
    assert_same_distributions(forced_logits(by_modules, prompts, paths), forced_logits(in_c, prompts, paths),
                              mean_kl=1e-5, max_kl=1e-3)


def test_batched_decode_steps_match_the_module_path_and_the_f32_path(smollm2_gguf, f32_engine):
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
    paths = [o.outputs[0].token_ids for o in in_c.generate(prompts, greedy)]
    batched = forced_logits(in_c, prompts, paths)  # decode batches of 6 rows: tiled int16 matmuls, grouped attention
    assert_same_distributions(forced_logits(by_modules, prompts, paths), batched, mean_kl=1e-5, max_kl=1e-3)
    f32 = torch.cat([forced_logits(f32_engine, [p], [q]) for p, q in zip(prompts, paths, strict=True)], dim=1)
    assert_same_distributions(f32, batched, mean_kl=1e-4, max_kl=1e-2)


def test_cached_and_uncached_prefills_give_the_same_numbers(smollm2_gguf):
    """Same input, same output: a prompt whose prefix the cache serves computes the same logits, to the
    bit, as the same prompt computed cold (a red-team run once saw "List three prime numbers." answer 32
    tokens cold and 14 warm)."""
    system = PROMPT.split("<|im_start|>user")[0]
    ask = system + "<|im_start|>user\nList three prime numbers.<|im_end|>\n<|im_start|>assistant\n"
    other = system + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    params = SamplingParams(temperature=0.0, max_tokens=32, logprobs=5)
    cold = engine(smollm2_gguf).generate([ask], params)[0]
    warm_engine = engine(smollm2_gguf)
    warm_engine.generate([other], params)
    warm = warm_engine.generate([ask], params)[0]
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens >= 16
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    assert warm.outputs[0].logprobs == cold.outputs[0].logprobs  # every logprob, bit for bit


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

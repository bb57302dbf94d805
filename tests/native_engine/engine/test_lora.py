"""LoRA adapters: a request through an adapter computes what a model with the adapter merged into its weights
computes (greedy tokens, and f32 logits within KL 1e-9 at every step), alone or batched with rows of other
adapters and of the base; adapters wait for a slot, leave it least recently used first, and keep their own
prefix cache. The GGUF adapter gives llama.cpp's tokens on the same file."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from native_engine import LoRARequest
from registry.modelbuilder import LoraSpec, build_lora
from registry.modelbuilder.lora_out import build_merged_gguf

from .conftest import _CACHE, GGML_TYPE_F32, PRESETS, BuiltModel, new_engine
from .helpers import assert_all_blocks_free, greedy, kl_per_position, token_ids

KL_LIMIT = 1e-9
ADAPTERS = {"a1": LoraSpec(rank=8, alpha=16.0, seed=1),
            "a2": LoraSpec(rank=4, alpha=4.0, targets=("q_proj", "v_proj", "down_proj"), seed=2)}


@pytest.fixture
def adapters(model: BuiltModel, models_root: Path):
    """name -> (GGUF adapter, PEFT directory, merged GGUF model), built once per preset."""
    key = ("lora", model.name)
    if key not in _CACHE:
        _CACHE[key] = {name: (build_lora(models_root / f"{model.name}-{name}.gguf", model.spec, lora),
                              build_lora(models_root / f"{model.name}-{name}-peft", model.spec, lora, fmt="peft"),
                              build_merged_gguf(models_root / f"{model.name}-{name}-merged.gguf", model.spec, lora))
                       for name, lora in ADAPTERS.items()}
    return _CACHE[key]


def _merged(model: BuiltModel, path: Path):
    key = ("merged-engine", str(path))
    if key not in _CACHE:
        _CACHE[key] = new_engine(BuiltModel(model.name, model.spec, path, path))
    return _CACHE[key]


@contextlib.contextmanager
def _recorded_logits(engine):
    """Every step's sampled rows' logits, as the sampler gets them, while the block runs."""
    seen: list[torch.Tensor] = []
    runner, sampler = engine.model_runner, engine.model_runner.sampler
    runner.sampler = lambda logits, meta: seen.append(logits.clone()) or sampler(logits, meta)
    try:
        yield seen
    finally:
        runner.sampler = sampler


@pytest.mark.parametrize("fmt", ["gguf", "peft"])
def test_adapter_matches_the_merged_model(model, adapters, prompts, fmt):
    engine = new_engine(model, max_loras=2)
    for name, (gguf_path, peft_dir, merged_path) in adapters.items():
        lora = LoRARequest(f"{name}-{fmt}", str(gguf_path if fmt == "gguf" else peft_dir))
        assert_matches_merged(engine, lora, _merged(model, merged_path), prompts([5, 40], seed=7), KL_LIMIT)
    assert_all_blocks_free(engine)


def assert_matches_merged(engine, lora, merged, prompts, kl_limit: float) -> None:
    """The engine with the adapter gives the merged model's 12 greedy tokens, each step's logits within
    ``kl_limit`` (KL) of the merged model's."""
    for prompt in prompts:
        with _recorded_logits(engine) as mine, _recorded_logits(merged) as theirs:
            ours = token_ids(engine.generate([prompt], greedy(12), lora_request=lora))
            assert ours == token_ids(merged.generate([prompt], greedy(12)))
        kl = kl_per_position(torch.cat(theirs), torch.cat(mine))
        assert len(kl) == 12 and kl.max().item() < kl_limit, f"{lora.lora_name}: KL per step {kl.tolist()}"


def test_adapter_changes_the_output(model, adapters, prompts):
    engine = new_engine(model, max_loras=1)
    prompt = prompts([20], seed=3)[0]
    base = token_ids(engine.generate([prompt], greedy(12)))
    through = token_ids(engine.generate([prompt], greedy(12), lora_request=LoRARequest("a1", str(adapters["a1"][0]))))
    assert base != through


def test_one_batch_mixes_adapters_and_the_base(model, adapters, prompts):
    """Eight requests in one batch, over two adapters and the base: each gets its own model's tokens."""
    engine = new_engine(model, max_loras=2)
    batch = prompts([3, 17, 9, 30, 16, 1, 48, 5], seed=11)
    loras = [None, "a1", "a2", "a1", None, "a2", "a1", "a2"]
    requests = [None if n is None else LoRARequest(n, str(adapters[n][0])) for n in loras]
    together = token_ids(engine.generate(batch, greedy(10), lora_request=requests))
    base = new_engine(model)
    for prompt, name, tokens in zip(batch, loras, together, strict=True):
        reference = base if name is None else _merged(model, adapters[name][2])
        assert [tokens] == token_ids(reference.generate([prompt], greedy(10))), name
    assert_all_blocks_free(engine)


def test_a_request_for_one_adapter_too_many_waits(model, adapters, prompts):
    engine = new_engine(model, max_loras=1)
    p1, p2 = prompts([8, 8], seed=5)
    engine.add_request("r1", p1, greedy(6), lora_request=LoRARequest("a1", str(adapters["a1"][0])))
    engine.add_request("r2", p2, greedy(6), lora_request=LoRARequest("a2", str(adapters["a2"][0])))
    finished_first = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished and finished_first is None:
                finished_first = out.request_id
            if out.request_id == "r2":
                assert finished_first == "r1", "r2 ran while r1's adapter held the only slot"
    assert engine.model_runner.lora.num_loads == 2


def test_adapters_leave_their_slot_least_recently_used_first(model, adapters, prompts):
    engine = new_engine(model, max_loras=2)
    a1, a2 = (LoRARequest(n, str(adapters[n][0])) for n in ("a1", "a2"))
    a3 = LoRARequest("a1-peft", str(adapters["a1"][1]))
    prompt = prompts([6], seed=1)
    for lora in (a1, a2, a1, a3, a1, a2):  # a3 evicts a2 (a1 was used after it); a2 comes back in a3's slot
        engine.generate(prompt, greedy(2), lora_request=lora)
    manager = engine.model_runner.lora
    assert manager.num_loads == 4 and manager.num_reads == 3  # a2 came back from the host cache
    assert list(manager.slots) == ["a1", "a2"]


def test_prefix_cache_keys_include_the_adapter(model, adapters, prompts):
    engine = new_engine(model, max_loras=2)
    prompt = prompts([70], seed=9)[0]  # four full blocks of 16
    a1 = LoRARequest("a1", str(adapters["a1"][0]))
    engine.generate([prompt], greedy(4))
    first = engine.generate([prompt], greedy(4), lora_request=a1)[0]
    again = engine.generate([prompt], greedy(4), lora_request=a1)[0]
    assert first.num_cached_tokens == 0  # the base's blocks are not the adapter's
    assert again.num_cached_tokens == 64
    assert token_ids([again]) == token_ids(_merged(model, adapters["a1"][2]).generate([prompt], greedy(4)))


def test_engine_without_slots_refuses_an_adapter(model, adapters):
    engine = new_engine(model, max_loras=0)
    with pytest.raises(ValueError, match="max_loras=0"):
        engine.add_request("r", [1, 2, 3], greedy(2), lora_request=LoRARequest("a1", str(adapters["a1"][0])))


def test_adapter_for_another_model_is_refused(model, adapters, models_root, prompts):
    other = model.spec.with_(hidden_size=32, num_heads=2, num_kv_heads=1, name="other")
    wrong = build_lora(models_root / f"{model.name}-wrong.gguf", other, LoraSpec(rank=2))
    engine = new_engine(model, max_loras=1, max_lora_rank=4)
    with pytest.raises(ValueError, match="made for another model"):
        engine.generate(prompts([4]), greedy(2), lora_request=LoRARequest("wrong", str(wrong)))
    with pytest.raises(ValueError, match="rank 8, more than max_lora_rank 4"):
        engine.generate(prompts([4]), greedy(2), lora_request=LoRARequest("a1", str(adapters["a1"][0])))
    assert token_ids(engine.generate(prompts([4]), greedy(2)))  # the engine goes on


def assert_llama_cpp_tokens(model, gguf_path, prompts) -> None:
    """llama.cpp with the adapter file and the engine with it give the same 12 greedy tokens."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(model.gguf), lora_path=str(gguf_path), n_ctx=256, verbose=False, n_threads=1,
                          n_threads_batch=1, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    try:
        engine = new_engine(model, max_loras=1)
        lora = LoRARequest("adapter", str(gguf_path))
        for prompt in prompts([6, 25], seed=4):
            theirs = [t for t, _ in zip(llm.generate(prompt, top_k=1, temp=0.0, reset=True), range(12))]
            assert token_ids(engine.generate([prompt], greedy(12), lora_request=lora)) == [theirs]
    finally:
        llm.close()


def test_gguf_adapter_gives_llama_cpp_tokens(model, adapters, prompts):
    assert_llama_cpp_tokens(model, adapters["a1"][0], prompts)


@pytest.mark.parametrize("method", ["ngram:k=3", "draft"])
def test_speculative_decoding_through_an_adapter_keeps_its_tokens(model, adapters, prompts, method):
    """The target verifies with its adapter; a draft model proposes without one (it is another model)."""
    speculative = f"draft:{model.gguf}:k=3" if method == "draft" else method
    engine = new_engine(model, max_loras=1, speculative=speculative)
    lora = LoRARequest("a1", str(adapters["a1"][0]))
    for prompt in prompts([12, 33], seed=8):
        ours = token_ids(engine.generate([prompt], greedy(12), lora_request=lora))
        assert ours == token_ids(_merged(model, adapters["a1"][2]).generate([prompt], greedy(12)))
    if method == "draft":
        assert engine.speculator.proposer.runner.lora is None


def test_the_sgmv_kernels_give_the_merged_models_tokens(model, adapters, prompts, monkeypatch):
    """The CUDA path's Triton kernels (in the interpreter on the CPU) in place of the torch loop."""
    pytest.importorskip("triton")
    from native_engine.kernels._triton import triton_available
    from native_engine.lora import punica

    if not triton_available():
        pytest.skip("triton was imported without TRITON_INTERPRET")
    monkeypatch.setattr(punica, "use_triton", lambda x: True)
    engine = new_engine(model, max_loras=2)
    batch = prompts([7, 20, 3], seed=12)
    names = ["a1", None, "a2"]
    requests = [None if n is None else LoRARequest(n, str(adapters[n][0])) for n in names]
    got = token_ids(engine.generate(batch, greedy(6), lora_request=requests))
    for prompt, name, tokens in zip(batch, names, got, strict=True):
        reference = new_engine(model) if name is None else _merged(model, adapters[name][2])
        assert [tokens] == token_ids(reference.generate([prompt], greedy(6))), name


@pytest.mark.parametrize("threads", [1, 2, 3])  # 3 on 2 cores: a thread descheduled within the matmul
def test_prefills_on_tiles_add_the_adapters_inside_the_matmul(tmp_path, threads, monkeypatch):
    """On Q4_1 tiles, every linear of a prefill takes its adapter rows in the tiled matmul's C call
    (`Linear.tiled_lora_forward`: each tile's expand while it is in cache); the same requests with that call off
    (the tiles, then `LoRALayer.apply`'s torch loop, the reference) give the same greedy tokens and logits within
    KL 1e-8 at every step (the deltas summed in another order differ in their last bits, and the next matmul rounds
    its input to int16 per group of 32, where a last bit can move a rounding: up to 4e-9 seen, as between the C
    decode step and the module path in test_cpu_decode.py). Rows of two adapters (one on q, v and down only) and of
    the base in one prefill, prompts longer than the kernel's 64-row blocks."""
    from native_engine.kernels import cpu_batch
    from native_engine.layers.linear import Linear

    from .test_cpu_decode import requantized_engine

    if cpu_batch.library() is None:
        pytest.skip("a plain-C build (no AVX2 or AVX-512 tier): no tiled kernel, the torch loop serves")
    spec = PRESETS["tiny-llama"].with_(hidden_size=256, num_heads=4, num_kv_heads=2)
    engine, lm = requantized_engine(tmp_path, "tiny-llama-64", spec, num_blocks=160, max_loras=2,
                                    enable_prefix_caching=False)
    paths = {name: build_lora(tmp_path / f"{name}.gguf", spec, lora) for name, lora in ADAPTERS.items()}
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    prompts = [list(range(40, 117)), [5, 17, 300, 2, 9], list(range(200, 330)), [7, 8, 9, 10]]
    names = ["a1", None, "a2", "a1"]
    requests = [None if n is None else LoRARequest(n, str(paths[n])) for n in names]
    params = [greedy(n) for n in (3, 5, 7, 9)]

    with _recorded_logits(engine) as fused:
        tokens = token_ids(engine.generate(prompts, params, lora_request=requests))
    layers = engine.model_runner.lora.linears.values()
    # every prompt row, and the 4 rows of each of the two decode steps of all four requests (the module path: no
    # C decode stack on this engine; 1-3 rows take the blocks' own kernel, then the torch loop)
    assert sum(linear.lora.fused_rows for linear in layers) == 4 * spec.num_layers * (sum(map(len, prompts)) + 2 * 4)
    with monkeypatch.context() as off, _recorded_logits(engine) as reference:
        off.setattr(Linear, "tiled_lora_forward", lambda self, x: None)
        assert token_ids(engine.generate(prompts, params, lora_request=requests)) == tokens
    kl = kl_per_position(torch.cat(reference), torch.cat(fused))
    assert len(kl) == sum(p.max_tokens for p in params) and kl.max().item() < 1e-8, kl.tolist()

"""CUDA graphs and the GPU step: the bucket list, graph replay equal to eager, graphs that really run, and a
decode step whose only device-to-host copy is the sampled ids (with logprobs and a grammar in the batch)."""

import json

import pytest
import torch

from native_engine.cuda_graph import batch_buckets

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_buckets_are_nano_vllms_and_cover_the_maximum():
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from registry.modelbuilder import PRESETS, build_gguf

    return str(build_gguf(tmp_path_factory.mktemp("graphs") / "m.gguf", PRESETS["tiny-qwen2"]))


def _engine(path: str, **kwargs):
    from native_engine import LLMEngine

    return LLMEngine.from_model(path, device="cuda", max_num_seqs=8, kv_cache_memory_bytes=64 << 20, **kwargs)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_gives_the_eager_tokens(tiny_gguf, dtype):
    from native_engine import SamplingParams

    prompts = ["a b c", "the quick brown fox jumps", "x"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        engine = _engine(tiny_gguf, dtype=dtype, enforce_eager=eager)
        assert (engine.model_runner.graphs is None) == eager
        outs[eager] = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
        if not eager:
            assert engine.model_runner.graphs.num_replays >= 20  # the decode steps ran as graphs
    if dtype == "float32":  # bf16: graph buckets pad the batch, so the matmuls may round differently
        assert outs[True] == outs[False]
    assert all(len(t) == 24 for t in outs[False])


def _dtoh_copies(prof) -> int:
    return sum(1 for e in prof.events() if "Memcpy DtoH" in e.name or "Memcpy DtoH" in getattr(e, "key", ""))


@pytest.mark.gpu
@needs_cuda
def test_a_decode_step_copies_to_the_host_once(tiny_gguf):
    from torch.profiler import ProfilerActivity, profile

    from native_engine import SamplingParams, StructuredOutputsParams

    engine = _engine(tiny_gguf, dtype="bfloat16")
    schema = {"type": "object", "properties": {"text": {"type": "string", "minLength": 60}}, "required": ["text"]}
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1, max_tokens=40,
                             ignore_eos=True),
              SamplingParams(temperature=1.0, seed=3, logprobs=3, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=schema))]
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", "the quick brown fox", p)
    for _ in range(3):  # prefill, then decode steps
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        outputs = engine.step()
        torch.cuda.synchronize()
    assert len(outputs) == 4
    assert _dtoh_copies(prof) == 1
    while engine.has_unfinished_requests():
        engine.step()


@pytest.mark.gpu
@needs_cuda
def test_structured_output_and_sampling_on_the_gpu(tiny_gguf):
    from native_engine import SamplingParams, StructuredOutputsParams

    engine = _engine(tiny_gguf, dtype="bfloat16")
    schema = {"type": "object", "additionalProperties": False, "required": ["id", "tag"],
              "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["a", "b"]}}}
    so = SamplingParams(temperature=0.8, top_k=40, seed=1, max_tokens=40,
                        structured_outputs=StructuredOutputsParams(json=schema))
    seeded = SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=16, ignore_eos=True)
    out = engine.generate(["x y", "a b c d"], [so, seeded])
    value = json.loads(out[0].outputs[0].text)
    assert set(value) == {"id", "tag"} and 0 <= value["id"] <= 99
    tokens = out[1].outputs[0].token_ids
    assert len(tokens) == 16 and len(set(tokens)) > 1  # it samples
    again = engine.generate(["x y", "a b c d"], [so, seeded])  # the same batch: the same draws
    assert again[1].outputs[0].token_ids == tokens and again[0].outputs[0].text == out[0].outputs[0].text


@pytest.mark.gpu
@needs_cuda
def test_scheduling_ahead_on_the_gpu_gives_the_step_by_step_tokens(tiny_gguf):
    from native_engine import SamplingParams

    prompts = ["a b c", "the quick brown fox jumps", "x", "one two"]
    same = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
            SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1, seed=4, max_tokens=20,
                           ignore_eos=True)] * 2
    outs, counts = {}, {}
    for ahead in (False, True):
        engine = _engine(tiny_gguf, dtype="float32", async_scheduling=ahead)
        inner, counts[ahead] = engine.scheduler.schedule_ahead, []
        engine.scheduler.schedule_ahead = lambda prev, inner=inner, c=counts[ahead]: c.append(inner(prev)) or c[-1]
        outs[ahead] = [o.outputs[0].token_ids for o in engine.generate(prompts, same)]  # same rows every step
        stop = outs[ahead][0][5]
        early = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop])] + same[1:]
        got = engine.generate(prompts, early)  # row 0 stops at its 6th token: a ghost row in the next step
        assert got[0].outputs[0].finish_reason == "stop" and len(got[0].outputs[0].token_ids) <= 6
        assert [len(o.outputs[0].token_ids) for o in got[1:]] == [20, 20, 20]
        assert engine.stats()["num_free_blocks"] == engine.stats()["num_kvcache_blocks"]
    assert outs[True] == outs[False]
    assert sum(x is not None for x in counts[True]) >= 15 and not any(counts[False])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("graphs", [True, False])
def test_speculation_on_the_gpu_gives_the_plain_greedy_tokens_in_float32(tiny_gguf, graphs):
    """Verify rows on the device (Triton paged attention with 1 + k queries a row, the rejection sampler, verify
    steps as graph steps or eager): in float32 the greedy tokens are the plain engine's. bf16 can differ at near
    ties (a verify step's matmuls have other shapes than a one-row step's, so other roundings)."""
    from native_engine import SamplingParams

    prompts = ["a b c d a b c d a b c d", "the quick brown fox jumps the quick brown fox jumps", "x y x y x y x"]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    plain = _engine(tiny_gguf, dtype="float32", enforce_eager=not graphs)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    engine = _engine(tiny_gguf, dtype="float32", enforce_eager=not graphs, speculative="ngram:k=3,adaptive=off")
    assert [o.outputs[0].token_ids for o in engine.generate(prompts, params)] == expected
    stats = engine.spec_decode_stats()
    assert stats["num_drafts"] > 0 and stats["num_accepted_tokens"] > 0, stats
    assert engine.stats()["num_free_blocks"] == engine.stats()["num_kvcache_blocks"]


@pytest.mark.gpu
@needs_cuda
def test_fused_decode_gives_the_unfused_tokens_in_float32(tiny_gguf):
    """`fused_decode` (kernels/fused_gemv.py: six kernels a layer at few rows, captured in the decode graphs)
    against the unfused kernels, float32 so both round alike: the same greedy tokens."""
    from native_engine import SamplingParams

    prompts = ["a b c", "the quick brown fox jumps", "x"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for fused in (False, True):
        engine = _engine(tiny_gguf, dtype="float32", fused_decode=fused)
        assert engine.model_runner.model.model.fused_decode == fused
        outs[fused] = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
    assert outs[True] == outs[False]


@pytest.mark.gpu
@needs_cuda
def test_unified_attention_gives_the_per_chunk_tokens_in_float32(tiny_gguf):
    """`unified_attention` (kernels/unified_attention.py: a mixed step's rows in one kernel), eager and with the
    mixed steps replayed from CUDA graphs, against the per-chunk gather-and-attention path, float32, chunked
    prompts beside decoding rows: the same greedy tokens."""
    from native_engine import SamplingParams

    prompts = ["a b c " * 9, "the quick brown fox jumps", "x", "the quick brown fox jumps over the lazy dog " * 4]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for on, eager in ((False, False), (True, True), (True, False)):  # per chunk; unified eager; unified graphs
        engine = _engine(tiny_gguf, dtype="float32", unified_attention=on, max_num_batched_tokens=32,
                         enforce_eager=eager)
        assert engine.model_runner.inputs.unified == on
        outs[on, eager] = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
        if on and not eager:
            assert engine.model_runner.mixed_graphs.num_replays > 0  # the mixed steps replayed graphs
    assert outs[True, True] == outs[False, False] == outs[True, False]

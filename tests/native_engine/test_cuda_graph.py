import pytest
import torch

from native_engine.cuda_graph import batch_buckets


def test_buckets_are_nano_vllms_and_cover_the_maximum():
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_graph_replay_gives_the_eager_tokens(tmp_path):
    from native_engine import LLMEngine, SamplingParams
    from registry.modelbuilder import PRESETS, build_gguf

    path = str(build_gguf(tmp_path / "m.gguf", PRESETS["tiny-qwen2"]))
    prompts = ["a b c", "the quick brown fox jumps", "x"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        engine = LLMEngine.from_model(path, device="cuda", dtype="float32", enforce_eager=eager, max_num_seqs=8,
                                      kv_cache_memory_bytes=64 << 20)
        assert (engine.model_runner.graphs is None) == eager
        outs[eager] = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
    assert outs[True] == outs[False]

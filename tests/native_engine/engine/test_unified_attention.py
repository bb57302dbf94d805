"""`EngineConfig.unified_attention` on the CPU: steps with prefill chunks send every row (decodes, fresh prompts,
chunks after a cached prefix) through one unified attention call per layer, here the Triton kernel itself under
TRITON_INTERPRET, and give the per-chunk path's tokens. On CUDA the same inputs reach the compiled kernel
(tests/native_engine/test_cuda_graph.py has the GPU check)."""

from __future__ import annotations

import importlib

import pytest

from native_engine.cuda_graph import MixedGraphs, token_buckets
from native_engine.layers import attention
from tests.native_engine.kernels.helpers import interpreted

from .helpers import assert_all_blocks_free, greedy, module_path, seeded, token_ids

kernel = importlib.import_module("native_engine.kernels.unified_attention")  # the package re-exports the function


@pytest.fixture
def unified_calls(monkeypatch):
    """Each unified call's rows' query lengths, with the interpreted Triton kernel doing the work."""
    pytest.importorskip("triton")
    if not interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (or a GPU is present)")
    calls = []

    def traced(q, k_cache, v_cache, tables, query_start, seq_lens, scale, max_query_len):
        calls.append((query_start[1:] - query_start[:-1]).tolist())
        return kernel.unified_attention_triton(q, k_cache, v_cache, tables, query_start, seq_lens, scale,
                                               max_query_len)

    monkeypatch.setattr(attention, "unified_attention", traced)
    return calls


def unified(engine):
    engine.model_runner.inputs.unified = True
    return engine


def test_mixed_steps_in_one_kernel_give_the_per_chunk_paths_tokens(make_engine, prompts, unified_calls):
    shared = prompts([40], seed=5)[0]
    batch = prompts([5, 37, 3, 21], seed=61) + [shared + p for p in prompts([9, 30], seed=6)]
    params = [greedy(10), greedy(10), seeded(10, seed=2, top_k=40), greedy(6), greedy(8), greedy(8)]
    settings = {"max_num_batched_tokens": 24, "max_num_seqs": 4}  # chunked prompts beside decoding rows

    def run(engine):
        engine.generate([shared], greedy(2))  # the shared prefix's blocks in the cache
        return token_ids(engine.generate(batch, params))

    expected = run(module_path(make_engine(**settings)))
    assert not unified_calls  # off on the CPU unless asked for
    assert run(unified(module_path(make_engine(**settings)))) == expected
    assert unified_calls, "no step went through the unified kernel"
    assert any(1 in lens and max(lens) > 1 for lens in unified_calls)  # decode rows and a chunk in one call


def test_off_by_default_and_never_on_the_cpu_unless_forced(make_engine):
    assert make_engine().model_runner.inputs.unified is False
    engine = make_engine(unified_attention=True)
    assert engine.config.unified_attention is True
    assert engine.model_runner.inputs.unified is False  # CPU: the bit-identical per-chunk prefill stays


class EagerMixedGraphs(MixedGraphs):
    """Replays by running the model on the static buffers (what a captured graph reads): the padding of tokens
    and rows and the runner's mixed-graph branch are checked on the CPU; the GPU test replays real graphs."""

    def _capture_all(self) -> None:
        self.graphs = dict.fromkeys(self.buckets)

    def _replay(self, bucket: int) -> None:
        self._forward(bucket)


def with_mixed_graphs(engine):
    runner = unified(engine).model_runner
    runner.mixed_graphs = EagerMixedGraphs(runner.model, runner.inputs.max_tokens, engine.config.max_num_seqs,
                                           runner.inputs.max_blocks, engine.model_config.hidden_size, engine.device,
                                           engine.dtype)
    return engine


def test_mixed_steps_from_graph_buffers_give_the_per_chunk_paths_tokens(make_engine, prompts, unified_calls):
    batch = prompts([5, 37, 3, 21, 50], seed=63)
    params = [greedy(8), greedy(8), seeded(8, seed=4, top_k=40), greedy(5), greedy(8)]
    settings = {"max_num_batched_tokens": 100, "max_num_seqs": 4}  # buckets of 64 and 100 tokens, 4 rows
    expected = token_ids(module_path(make_engine(**settings)).generate(batch, params))
    engine = with_mixed_graphs(module_path(make_engine(**settings)))
    graphs = engine.model_runner.mixed_graphs
    assert graphs.buckets == [64, 100]
    kv = engine.model_runner.kv_cache  # zeros at start
    tables = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: (out := schedule(), tables.extend(s.seq.block_table for s in out.scheduled))[0]
    assert token_ids(engine.generate(batch, params)) == expected
    assert graphs.num_replays >= 2 and unified_calls  # the prompts' steps ran from the graph buffers
    used = sorted({b for table in tables for b in table})
    unused = [b for b in range(kv.shape[2]) if b not in used]
    assert kv[:, :, unused].abs().sum() == 0  # padded tokens (slot -1) wrote nowhere
    assert_all_blocks_free(engine)


def test_a_bucket_covers_the_tokens_rows_and_table_width_or_none_does(make_engine):
    engine = with_mixed_graphs(make_engine(max_num_batched_tokens=100, max_num_seqs=4))
    graphs = engine.model_runner.mixed_graphs
    assert graphs.bucket(64, 4, 3) == 64 and graphs.bucket(65, 1, 3) == 100 and graphs.bucket(3, 2, 1) == 64
    assert graphs.bucket(101, 1, 1) is None and graphs.bucket(10, 5, 1) is None
    assert graphs.bucket(10, 1, graphs.max_blocks + 1) is None


def test_token_buckets():
    assert token_buckets(100) == [64, 100]
    assert token_buckets(4096) == [64, 128, 256, 512, 1024, 2048, 4096]
    assert token_buckets(5000) == [64, 128, 256, 512, 1024, 2048, 4096, 5000]
    assert token_buckets(16) == [16]

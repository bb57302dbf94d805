"""The CUDA-graph step path on the CPU: `DecodeGraphs` with its capture and replay replaced by an eager call on
its own static buffers, so the graph layout of the step's inputs (`InputBuffers.prepare` with a bucket), the
table copy and the model runner's graph branch are checked here; the GPU tests replay real graphs."""

from __future__ import annotations

from native_engine.cuda_graph import DecodeGraphs

from .helpers import assert_all_blocks_free, greedy, seeded, token_ids


class EagerGraphs(DecodeGraphs):
    """Replays by running the model on the static buffers (what a captured graph reads)."""

    def _capture_all(self) -> None:
        self.graphs = dict.fromkeys(self.buckets)

    def _replay(self, bs: int) -> None:
        self._forward(bs)


def _with_graphs(engine):
    runner = engine.model_runner
    runner.graphs = EagerGraphs(runner.model, 8, runner.inputs.max_blocks, engine.model_config.hidden_size,
                                engine.device, engine.dtype)
    return engine


def test_graph_steps_give_the_eager_tokens(make_engine, prompts):
    batch = prompts([5, 21, 40, 9], seed=90)  # four rows: bucket 4, no padding, the same matmuls as eager
    params = [greedy(20), seeded(20, seed=1, top_k=40, top_p=0.9, repetition_penalty=1.1), greedy(20), greedy(20)]
    eager = token_ids(make_engine().generate(batch, params))
    graphed = _with_graphs(make_engine())
    assert token_ids(graphed.generate(batch, params)) == eager
    assert graphed.model_runner.graphs.num_replays == 19  # every decode step
    assert_all_blocks_free(graphed)


def test_padded_rows_write_nothing(make_engine, prompts):
    engine = _with_graphs(make_engine())
    batch = prompts([6, 13, 30], seed=91)  # three rows in bucket 4: one padded row, slot -1
    kv = engine.model_runner.kv_cache  # [2, layers, blocks, block_size, kv heads, D], zeros at start
    tables = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: (out := schedule(), tables.extend(s.seq.block_table for s in out.scheduled))[0]
    outputs = engine.generate(batch, greedy(12))
    assert all(len(o.outputs[0].token_ids) == 12 for o in outputs)
    assert engine.model_runner.graphs.num_replays == 11
    used = sorted({b for table in tables for b in table})
    unused = [b for b in range(kv.shape[2]) if b not in used]
    assert kv[:, :, used].abs().sum() > 0 and kv[:, :, unused].abs().sum() == 0  # a slot of -1 wrote nowhere
    assert_all_blocks_free(engine)


def test_verify_steps_run_as_graph_steps(make_engine, prompts):
    """A decode-only step with verify rows (1 + k query tokens each) takes the bucket of its query tokens;
    the expanded tables and context lengths give the eager tokens."""
    base = prompts([6, 11], seed=92)
    batch = [p + p + p for p in base]  # repeats: n-gram lookup proposes from the first decode step on
    eager = token_ids(make_engine().generate(batch, greedy(24)))
    engine = make_engine(speculative="ngram:k=3,adaptive=off")
    runner = engine.model_runner
    runner.graphs = EagerGraphs(runner.model, 8, runner.inputs.max_blocks, engine.model_config.hidden_size,
                                engine.device, engine.dtype)
    seen, build = [], runner.inputs.build
    runner.inputs.build = lambda plan, graph_inputs=None: (step := build(plan, graph_inputs), seen.append(
        (step.graph_bs, int(plan.specs.sum()))))[0]
    assert token_ids(engine.generate(batch, greedy(24))) == eager
    assert engine.spec_decode_stats()["num_drafts"] > 0
    assert any(bs is not None and drafts > 0 for bs, drafts in seen)  # verify steps replayed a graph
    assert_all_blocks_free(engine)

"""Scheduling ahead (`async_scheduling`): a decode step launched before the previous one's tokens reach the host
gives the same outputs as the step-by-step engine, on the CPU (where nothing overlaps, but every path of the
bookkeeping runs: placeholders, ghost rows of sequences that stop meanwhile, aborts and arrivals between steps,
graph-layout inputs fed from the previous step's ids)."""

from __future__ import annotations

import json

from native_engine import SamplingParams, StructuredOutputsParams

from .helpers import assert_all_blocks_free, greedy, seeded, stream, token_ids
from .test_graph_inputs import _with_graphs


class AheadCounter:
    """Wraps engine.scheduler.schedule_ahead and counts the steps it scheduled ahead."""

    def __init__(self, engine) -> None:
        self.count = 0
        self._inner = engine.scheduler.schedule_ahead
        engine.scheduler.schedule_ahead = self

    def __call__(self, prev):
        out = self._inner(prev)
        self.count += out is not None
        return out


def _pair(make_engine, **kwargs):
    sync, ahead = make_engine(async_scheduling=False, **kwargs), make_engine(async_scheduling=True, **kwargs)
    return sync, ahead, AheadCounter(ahead)


def _summary(outputs) -> list[tuple]:
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].stop_reason)
            for o in outputs]


def test_the_cpu_default_is_off_and_the_flag_turns_it_on(make_engine):
    assert make_engine().async_scheduling is False
    assert make_engine(async_scheduling=True).async_scheduling is True


def test_greedy_seeded_and_early_stops_give_the_step_by_step_outputs(make_engine, prompts):
    sync, ahead, counter = _pair(make_engine)
    batch = prompts([5, 17, 9, 33, 12, 8], seed=7)
    plain = token_ids(sync.generate(batch, greedy(24)))
    stop_token = plain[2][6]  # request 2 stops at its 7th token (EOS-like: decided by the sampled token)
    text = sync.tokenizer.decode(plain[3][:10])
    stop_string = text[-3:] if text[-3:].strip() else text[-5:]
    params = [greedy(24), greedy(9), greedy(24, stop_token_ids=[stop_token]), greedy(24, stop=[stop_string]),
              seeded(20, seed=3, top_k=40, repetition_penalty=1.1), seeded(15, seed=4, logprobs=2)]
    expected = sync.generate(batch, params)
    got = ahead.generate(batch, params)
    assert _summary(got) == _summary(expected)
    assert got[2].outputs[0].finish_reason == "stop" and got[2].outputs[0].stop_reason == stop_token
    for mine, theirs in zip(got[5].outputs[0].logprobs, expected[5].outputs[0].logprobs, strict=True):
        # a ghost row changes a step's batch size, and with it the matmuls' rounding: the same ids, values within 1e-5
        assert [t for t, _ in mine.top_logprobs] == [t for t, _ in theirs.top_logprobs]
        assert max(abs(a - b) for (_, a), (_, b) in zip(mine.top_logprobs, theirs.top_logprobs)) < 1e-5
    assert counter.count >= 15  # most decode steps were scheduled ahead
    assert_all_blocks_free(ahead)


def test_graph_layout_steps_are_fed_from_the_previous_steps_ids(make_engine, prompts):
    sync = make_engine(async_scheduling=False)
    ahead = _with_graphs(make_engine(async_scheduling=True))
    counter = AheadCounter(ahead)
    batch = prompts([6, 13, 30, 4], seed=11)
    params = [greedy(16), greedy(5), greedy(16, stop_token_ids=[]), seeded(12, seed=9, top_k=40)]
    assert token_ids(ahead.generate(batch, params)) == token_ids(sync.generate(batch, params))
    assert counter.count >= 10 and ahead.model_runner.graphs.num_replays >= counter.count
    assert_all_blocks_free(ahead)


def _drive(engine, batch, late_prompt) -> dict[str, list[int]]:
    """Three requests, a fourth added after step 3, request b aborted after step 5; tokens per request."""
    for i, p in enumerate(batch):
        engine.add_request("abc"[i], p, greedy(20))
    tokens: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
        steps += 1
        if steps == 3:
            engine.add_request("d", late_prompt, greedy(12))
        if steps == 5:
            engine.abort("b")
    return tokens


def test_arrivals_and_aborts_between_steps(make_engine, prompts):
    sync, ahead, counter = _pair(make_engine)
    batch, late = prompts([7, 20, 11], seed=21), prompts([9], seed=22)[0]
    expected, got = _drive(sync, batch, late), _drive(ahead, batch, late)
    assert got["a"] == expected["a"] and got["c"] == expected["c"] and got["d"] == expected["d"]
    assert len(got["a"]) == 20 and len(got["d"]) == 12 and len(got["b"]) < 20
    assert counter.count > 0
    assert_all_blocks_free(ahead)


def test_preemption_under_block_pressure(make_engine, prompts):
    kwargs = dict(num_blocks=12, block_size=4, max_num_seqs=4)
    sync, ahead, counter = _pair(make_engine, **kwargs)
    batch = prompts([6, 9, 5, 7], seed=31)
    assert token_ids(ahead.generate(batch, greedy(14))) == token_ids(sync.generate(batch, greedy(14)))
    assert counter.count > 0
    assert_all_blocks_free(ahead)


def test_a_grammar_or_n_samples_in_the_batch_runs_step_by_step(make_engine, prompts):
    sync, ahead, counter = _pair(make_engine)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"],
              "additionalProperties": False}
    so = SamplingParams(temperature=0, max_tokens=30, structured_outputs=StructuredOutputsParams(json=schema))
    batch = prompts([5, 8], seed=41)
    got = ahead.generate(batch, [so, greedy(8)])
    assert "n" in json.loads(got[0].outputs[0].text) and counter.count == 0
    assert _summary(got) == _summary(sync.generate(batch, [so, greedy(8)]))
    two = SamplingParams(n=2, temperature=0.8, seed=5, max_tokens=8, ignore_eos=True)
    outs = ahead.generate(batch, [two, greedy(8)])
    assert [len(c.token_ids) for c in outs[0].outputs] == [8, 8] and counter.count == 0
    assert_all_blocks_free(ahead)


def test_streamed_deltas_and_timestamps(make_engine, prompts):
    _, ahead, _ = _pair(make_engine)
    batch = prompts([5, 9], seed=51)
    deltas = stream(ahead, {"x": (batch[0], greedy(10)), "y": (batch[1], greedy(4))})
    assert [len(d.outputs[0].token_ids) for d in deltas["x"]] == [1] * 10
    assert [d.finished for d in deltas["y"]] == [False, False, False, True]
    metrics = deltas["x"][-1].metrics
    assert len(metrics.token_times) == 10 and metrics.token_times == sorted(metrics.token_times)
    assert_all_blocks_free(ahead)

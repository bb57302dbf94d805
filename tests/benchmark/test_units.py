"""The pieces on their own: arrivals, lengths, prompts, datasets, metrics, cost, flag parsing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmark.arrivals import arrival_offsets
from benchmark.config import parse_goodput, parse_labels
from benchmark.cost import prefill_decode_ratio, split_bill
from benchmark.metrics import calculate_metrics, peak_concurrency
from benchmark.prompts import LengthSpec, dataset_requests, synthetic_requests
from benchmark.records import RequestRecord
from benchmark.tokenizer import TokenCounter
from registry.modelbuilder import PRESETS, build_gguf


def _record(start: float, ttft: float, itl: list[float], tokens: int, prompt: int = 10) -> RequestRecord:
    return RequestRecord("r", prompt, tokens, start_time=start, ttft=ttft, itl=itl, latency=ttft + sum(itl),
                         output_tokens=tokens, success=True)


def test_arrivals_rescale_to_n_over_rate_and_burst_with_low_burstiness():
    offsets = arrival_offsets(100, rate=5.0, burstiness=1.0, seed=3)
    assert offsets[-1] == pytest.approx(100 / 5.0) and offsets == sorted(offsets)
    assert arrival_offsets(4, float("inf")) == [0.0] * 4
    steady = np.diff(arrival_offsets(500, 10.0, burstiness=10.0))
    bursty = np.diff(arrival_offsets(500, 10.0, burstiness=0.2))
    assert np.std(bursty) > 3 * np.std(steady)
    with pytest.raises(ValueError):
        arrival_offsets(3, 1.0, burstiness=0)


def test_length_spec():
    assert LengthSpec.parse("256") == LengthSpec(256, 0.0)
    assert LengthSpec.parse("256:32") == LengthSpec(256, 32.0)
    for bad in ("0", "x", "10:-1", "1:2:3"):
        with pytest.raises(ValueError):
            LengthSpec.parse(bad)
    assert min(LengthSpec(3, 10).sample(np.random.default_rng(0), 200)) >= 1


def test_vllm_tpot_example_and_pooled_itl():
    """metrics-and-cost.md §1.2: TTFT 100 ms, E2EL 1,100 ms, 101 output tokens -> TPOT 10 ms."""
    one = _record(0.0, 0.1, [0.01] * 100, 101)
    two = _record(0.5, 0.2, [0.05, 0.15], 3)
    m = calculate_metrics([one, two], duration=2.0, percentiles=(50, 99))
    assert m["mean_tpot_ms"] == pytest.approx((10 + 100) / 2)
    assert m["mean_itl_ms"] == pytest.approx(1000 * (1.0 + 0.2) / 102)  # chunk-weighted, unlike TPOT
    assert m["total_output_tokens"] == 104 and m["output_throughput"] == 52
    assert m["median_tok_s_per_user"] == pytest.approx(1000 / 55)
    assert m["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 100)


def test_peak_concurrency_is_a_sweep_line():
    records = [_record(0, 1, [], 1), _record(0.5, 1, [], 1), _record(1.0, 1, [], 1), _record(3, 1, [], 1)]
    assert peak_concurrency(records) == 2  # the first ends exactly when the third starts


def test_cost_split_worked_example():
    """metrics-and-cost.md §4.2: $2.50, 40 M in, 8 M out, k = 5 -> $0.03125 and $0.15625 per Mtok."""
    c_in, c_out = split_bill(2.50, 40_000_000, 8_000_000, 5.0)
    assert c_in * 1e6 == pytest.approx(0.03125) and c_out * 1e6 == pytest.approx(0.15625)
    assert 1000 * c_in + 200 * c_out == pytest.approx(0.0000625)


def test_prefill_decode_ratio():
    # 100 prompt tokens in 0.1 s (1000 tok/s); 10 tokens after the first in 0.5 s (20 tok/s): k = 50
    records = [_record(0, 0.1, [0.05] * 10, 11, prompt=100)]
    assert prefill_decode_ratio(records) == pytest.approx(50)


def test_goodput_and_label_flags():
    assert parse_goodput(["ttft:500 tpot:50", "e2el:2000"]) == {"ttft": 500, "tpot": 50, "e2el": 2000}
    assert parse_goodput(["ttft:500,tpot:50"]) == {"ttft": 500, "tpot": 50}
    for bad in (["ttfb:1"], ["ttft:x"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
    assert parse_labels(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ValueError):
        parse_labels(["novalue"])


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    path = build_gguf(tmp_path_factory.mktemp("tok") / "tiny.gguf", PRESETS["tiny-qwen2"], dtype="f32")
    return TokenCounter.load(path)


def test_synthetic_prompts_have_exact_token_counts_and_unique_starts(counter):
    requests = synthetic_requests(counter, 20, LengthSpec(40, 15), LengthSpec(8), seed=1)
    for request in requests:
        assert counter.count(request.prompt) == request.prompt_len and request.is_prompt_len_exact
    lengths = [r.prompt_len for r in requests]
    assert len(set(lengths)) > 5  # the stdev was applied
    starts = {" ".join(r.prompt.split()[:4]) for r in requests}
    assert len(starts) == 20


def test_without_a_tokenizer_lengths_are_marked_approximate():
    requests = synthetic_requests(None, 3, LengthSpec(10), LengthSpec(5))
    assert all(len(r.prompt.split()) == 10 and not r.is_prompt_len_exact for r in requests)


def test_sharegpt_json_and_jsonl(tmp_path, counter):
    conversations = [{"conversations": [{"from": "human", "value": "tell me a story"},
                                        {"from": "gpt", "value": "once upon a time there was"}]},
                     {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"},
                                   {"role": "assistant", "content": "hi there"}]},
                     {"prompt": "the quick brown fox", "completion": "jumps"}, {"nothing": 1}]
    (tmp_path / "d.json").write_text(json.dumps(conversations))
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(c) for c in conversations))
    for name in ("d.json", "d.jsonl"):
        requests = dataset_requests(tmp_path / name, counter, 6, None, seed=0)
        assert {r.prompt for r in requests} == {"tell me a story", "hello", "the quick brown fox"}
        by_prompt = {r.prompt: r for r in requests}
        assert by_prompt["tell me a story"].output_len == counter.count("once upon a time there was")
        assert by_prompt["hello"].prompt_len == counter.count("hello")
    fixed = dataset_requests(tmp_path / "d.json", counter, 3, LengthSpec(7))
    assert {r.output_len for r in fixed} == {7}


def test_dataset_errors_name_the_file_and_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        dataset_requests(tmp_path / "bad.jsonl", None, 2, None)
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ValueError, match="no prompts found"):
        dataset_requests(tmp_path / "empty.json", None, 2, None)

"""The torch-free parts: `speculative=` strings, prompt lookup, the adaptive k."""

import pytest

from native_engine.config import EngineConfig
from native_engine.spec_decode.adaptive import AdaptiveK, StepCosts, expected_accepted
from native_engine.spec_decode.config import SpeculativeConfig
from native_engine.spec_decode.ngram import NgramProposer


@pytest.mark.parametrize("text, expected", [
    ("ngram", SpeculativeConfig("ngram")),
    ("ngram:k=6", SpeculativeConfig("ngram", 6)),
    ("ngram:k=2,min=2,max=5", SpeculativeConfig("ngram", 2, 2, 5)),
    ("ngram:k=4,adaptive=off", SpeculativeConfig("ngram", 4, adaptive=False)),
    ("draft:smollm2:135m:k=3", SpeculativeConfig("draft", 3, draft_model="smollm2:135m")),
    ("draft:/models/small.gguf", SpeculativeConfig("draft", draft_model="/models/small.gguf")),
    ("draft:m.gguf:k=2,layers=8", SpeculativeConfig("draft", 2, draft_model="m.gguf", draft_layers=8)),
    ("off", None), ("", None), (None, None),
])
def test_parse(text, expected):
    assert SpeculativeConfig.parse(text) == expected
    if expected is not None:
        assert SpeculativeConfig.parse(expected.describe()) == expected


@pytest.mark.parametrize("text, message", [
    ("eagle:k=3", "method must be one of"), ("ngram:k=0", "k must be in"), ("ngram:k=x", "must be an integer"),
    ("ngram:q=1", "unknown option"), ("ngram:min=3,max=2", "min <= max"), ("draft", "needs a model"),
    ("ngram:adaptive=maybe", "adaptive must be on or off"), ("ngram:layers=3", "needs a draft model"),
])
def test_parse_errors(text, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(text)
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m.gguf", speculative=text)


def test_ngram_proposes_the_continuation_of_the_latest_longest_match():
    p = NgramProposer(k=3, min_n=1, max_n=3)
    assert p.propose([1, 2, 3, 4, 5, 9, 2, 3]) == [4, 5, 9]  # "2 3" seen before, followed by 4 5 9
    assert p.propose([1, 2, 3, 7, 2, 3, 8, 2, 3]) == [8, 2, 3]  # the latest "2 3" wins
    assert p.propose([5, 6, 7, 8]) == []  # nothing repeats
    assert p.propose([1, 2, 3, 1, 2]) == [3, 1, 2]
    assert p.propose([4, 4, 4, 4], k=2) == [4, 4]
    assert p.propose([1, 2, 3, 1, 2, 3], k=5) == [1, 2, 3, 1, 2]  # a repeating span goes on repeating
    assert p.propose([1, 2, 9, 1, 2], k=0) == []


def test_ngram_prefers_longer_matches():
    p = NgramProposer(k=2, min_n=1, max_n=3)
    # "3" alone last occurred before 6, but "2 3" (longer) occurred before 4
    assert p.propose([1, 2, 3, 4, 5, 3, 6, 0, 2, 3]) == [4, 5]
    assert NgramProposer(k=2, min_n=3, max_n=3).propose([1, 2, 3, 4, 5, 3, 6, 0, 2, 3]) == []


def test_expected_accepted():
    assert expected_accepted(1.0, 4) == 4 and expected_accepted(0.0, 4) == 0
    assert expected_accepted(0.5, 2) == pytest.approx(0.75)


def test_step_costs_need_samples_and_interpolate():
    costs = StepCosts()
    costs.record(1, 1.0)  # a shape's first step: one-off costs, left out
    assert costs.estimate(1) is None
    costs.record(1, 10.0)
    assert costs.measured(1) is None and costs.estimate(1) == 10.0  # a plain step's time needs 3 samples
    for t in (10.0, 11.0, 100.0):  # a stall does not move the median much
        costs.record(1, t)
    assert costs.measured(1) == pytest.approx(10.5)
    assert costs.estimate(5) == pytest.approx(10.5)  # one size sampled: flat above it (try the size)
    costs.record(5, 99.0)
    costs.record(5, 14.5)  # one probe after the first is enough to know a larger size
    assert costs.estimate(3) == pytest.approx(12.5)  # between two sizes: interpolated
    assert costs.estimate(9) == pytest.approx(18.5)  # above: the slope of the two largest


def test_step_costs_forget_stale_sizes():
    costs = StepCosts()
    costs.record(5, 0.5)
    costs.record(5, 0.5)  # a probe during a stall
    for _ in range(600):
        costs.record(1, 0.01)
    assert costs.estimate(5) == pytest.approx(0.01)  # forgotten: flat from the plain size again, probed anew
    assert costs.measured(1) == pytest.approx(0.01)


def _measure(adaptive, sizes):
    for size, seconds in sizes.items():
        for _ in range(4):
            adaptive.record_step(size, seconds)


def test_adaptive_speculates_when_verify_steps_are_cheap():
    adaptive = AdaptiveK(4)
    assert adaptive.plan({7: 4}) == {7: 0}  # no plain step measured yet: measure one first
    _measure(adaptive, {1: 0.010, 2: 0.011, 5: 0.013})
    assert adaptive.plan({7: 4}) == {7: 4}
    for _ in range(10):
        adaptive.observe(7, 4, 4)
    assert adaptive.plan({7: 4}) == {7: 4}


def test_adaptive_stays_off_when_verify_steps_cost_their_rows():
    adaptive = AdaptiveK(4)
    _measure(adaptive, {16: 0.016, 17: 0.017, 20: 0.020, 32: 0.032, 80: 0.080})  # compute-bound: 1 ms a row
    for seq in range(16):
        adaptive.seqs[seq] = type(adaptive._state(seq))(alpha=0.5)
    assert set(adaptive.plan({s: 4 for s in range(16)}).values()) == {0}
    rests = [adaptive.worth_trying(16) for _ in range(17)]  # the proposer is not asked for a while
    assert rests == [False] * 16 + [True] and adaptive.worth_trying(1)


def test_a_sequence_that_keeps_missing_backs_off():
    adaptive = AdaptiveK(4)
    _measure(adaptive, {1: 0.010, 2: 0.014, 5: 0.020})
    adaptive.observe(3, 4, 0)
    adaptive.observe(3, 4, 0)
    plans = [adaptive.plan({3: 4})[3] for _ in range(8)]
    assert plans[:4] == [0, 0, 0, 0]  # sits out its back-off


def test_shadow_hits_bring_a_sequence_back():
    """Proposals checked for free while the sequence sits out: once its text turns copyable it is back."""
    adaptive = AdaptiveK(4)
    _measure(adaptive, {1: 0.010, 2: 0.016, 5: 0.030})
    for _ in range(4):
        adaptive.observe(3, 4, 0)
    assert adaptive.plan({3: 4})[3] == 0 and adaptive.seqs[3].skip > 0
    for _ in range(12):
        adaptive.observe_shadow(3, True)
    assert adaptive.seqs[3].skip == 0 and adaptive.plan({3: 4})[3] > 0


def test_fixed_k_without_adaptation():
    adaptive = AdaptiveK(3, adaptive=False)
    assert adaptive.plan({1: 5, 2: 1, 3: 0}) == {1: 3, 2: 1, 3: 0}

import pytest

from native_engine.sampling_params import SamplingParams


def test_defaults():
    params = SamplingParams()
    assert (params.n, params.temperature, params.top_k, params.top_p, params.max_tokens) == (1, 1.0, 0, 1.0, 16)
    assert params.stop == [] and params.stop_token_ids == [] and params.logprobs is None
    assert not params.is_greedy and SamplingParams(temperature=0).is_greedy


def test_stop_string_becomes_list_and_lists_are_not_shared():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop_token_ids=(3, 4)).stop_token_ids == [3, 4]
    a, b = SamplingParams(), SamplingParams()
    a.stop.append("x")
    assert b.stop == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "temperature must be >= 0, got -1"),
        ({"n": 0}, "n must be an integer >= 1, got 0"),
        ({"n": 1.5}, "n must be an integer >= 1"),
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
        ({"top_k": -2}, "top_k must be -1, 0 (off) or a positive integer, got -2"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"min_p": -0.1}, "min_p must be in [0, 1]"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0, got 0"),
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3"),
        ({"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2]"),
        ({"seed": "1"}, "seed must be an integer or None"),
        ({"logprobs": -1}, "logprobs must be None or an integer >= 0, got -1"),
        ({"stop": ["ok", ""]}, "stop must hold non-empty strings"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must hold integers >= 0"),
    ],
)
def test_invalid_values_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("kwargs", [{"top_k": -1}, {"top_k": 40}, {"logprobs": 0}, {"seed": 7}, {"n": 4}])
def test_valid_edge_values(kwargs):
    SamplingParams(**kwargs)

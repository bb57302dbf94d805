"""Ollama's option precedence and validation."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequest
from core.options import Options, resolve_options


def test_defaults_are_ollamas():
    o = Options()
    assert (o.temperature, o.top_k, o.top_p, o.min_p, o.num_predict, o.seed) == (0.8, 40, 0.9, 0.0, -1, -1)
    assert (o.repeat_penalty, o.repeat_last_n, o.num_ctx) == (1.0, 64, 2048)


def test_request_overrides_model_params_which_override_defaults():
    model = {"temperature": 0.2, "num_ctx": 4096, "stop": ["<|im_end|>"]}
    request = {"temperature": 0.9}
    o = resolve_options(model, request, defaults={"num_ctx": 1024, "top_k": 7})
    assert (o.temperature, o.num_ctx, o.top_k, o.stop) == (0.9, 4096, 7, ("<|im_end|>",))


def test_unknown_keys_are_ignored_and_none_does_not_override():
    o = resolve_options({"temperature": 0.3}, {"mirostat": 2, "temperature": None})
    assert o.temperature == 0.3


@pytest.mark.parametrize("bad", [{"temperature": "hot"}, {"top_p": 1.5}, {"num_ctx": 1}, {"stop": 5}])
def test_bad_values_name_the_option(bad):
    with pytest.raises(InvalidRequest) as err:
        resolve_options(None, bad)
    assert next(iter(bad)) in err.value.message


def test_a_single_stop_string_becomes_a_list():
    assert resolve_options({"stop": "END"}).stop == ("END",)


def test_fixed_seed_is_used_and_random_seed_varies():
    assert Options(seed=42).sampling_seed() == 42
    assert len({Options().sampling_seed() for _ in range(5)}) > 1


def test_empty_stop_strings_are_dropped():
    """Found by the fuzz tier: an empty stop string was a 500 on the native engine (it stops everywhere)."""
    from core.options import resolve_options

    assert resolve_options({"stop": ["", "</s>"]}).stop == ("</s>",)
    assert resolve_options({"stop": ""}).stop == ()

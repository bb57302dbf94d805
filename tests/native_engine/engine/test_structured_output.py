"""Structured outputs on the tiny random models: whatever the weights say, the grammar decides what can
come out (llguidance bitmasks applied to the logits), in a batch beside unconstrained rows, for n > 1."""

from __future__ import annotations

import json
import re

import pytest

from native_engine import SamplingParams, StructuredOutputsParams

from .helpers import assert_all_blocks_free, greedy, seeded

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["id", "tag"],
          "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "tag": {"enum": ["red", "blue"]}}}


def _texts(outputs) -> list[str]:
    return [c.text for out in outputs for c in out.outputs]


def test_constrained_rows_follow_their_grammar_beside_free_ones(engine, prompts):
    batch = prompts([9, 30, 5, 17], seed=80)
    params = [greedy(40, structured_outputs=StructuredOutputsParams(json=SCHEMA)),
              seeded(40, seed=3, structured_outputs=StructuredOutputsParams(regex=r"[a-c]{2,5}-[0-9]{3}")),
              greedy(12),
              seeded(40, seed=4, n=3, structured_outputs=StructuredOutputsParams(choice=("yes", "no", "maybe")))]
    outputs = engine.generate(batch, params)
    value = json.loads(outputs[0].outputs[0].text)
    assert set(value) == {"id", "tag"} and 0 <= value["id"] <= 999 and value["tag"] in ("red", "blue")
    assert re.fullmatch(r"[a-c]{2,5}-[0-9]{3}", outputs[1].outputs[0].text)
    assert outputs[2].outputs[0].finish_reason == "length"  # free: the model's own tokens
    assert all(t in ("yes", "no", "maybe") for t in _texts([outputs[3]]))
    assert all(c.finish_reason == "stop" for out in (outputs[0], outputs[1], outputs[3]) for c in out.outputs)
    assert engine.model_runner.structured.matchers == {}
    assert_all_blocks_free(engine)


def test_a_malformed_schema_is_the_requests_error(engine, prompts):
    bad = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json={"type": "no-such-type"}))
    with pytest.raises(ValueError, match="invalid structured output"):
        engine.add_request("bad", prompts([5])[0], bad)
    assert not engine.has_unfinished_requests()


def test_structured_params_need_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json=SCHEMA, json_object=True)
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()

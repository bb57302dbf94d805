"""Field-by-field comparison of an answer through ``infer serve`` with the same request sent to vLLM
directly (tests/remote/test_vllm_conformance.py).

A non-streamed body is compared leaf by leaf after :func:`normalize`; a stream is first folded into
one body per choice (:func:`fold_sse`): the texts joined, the logprobs entries joined, the last
``finish_reason``/``stop_reason`` and the usage chunk. Chunk boundaries are not compared (the gateway
sends the role with the first text, vLLM in a chunk of its own).

What ``normalize`` drops, and why (each a documented difference, README "Remote backends"):

- per-response values: ``id``, ``created``; ``system_fingerprint`` (``fp_infer`` here, vLLM's version there);
- the gateway's additions: ``usage.cost_usd`` (a priced backend);
- fields whose value is ``null`` or an empty list: vLLM writes every field of its response models
  (``refusal``, ``audio``, ``kv_transfer_params``, ``tool_calls: []``, …); the gateway leaves out what it
  has no value for;
- vLLM's extensions the gateway does not carry: ``usage.prompt_tokens_details.created_cache_tokens``
  and ``multimodal_tokens``;
- an error's ``type``: the gateway answers in OpenAI's types (``invalid_request_error``), vLLM names the
  status (``BadRequestError``); message, param and code are compared.
"""

from __future__ import annotations

import json
from typing import Any

DROPPED = frozenset({"id", "created", "system_fingerprint", "cost_usd", "created_cache_tokens", "multimodal_tokens"})


def normalize(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: normalize(v) for k, v in value.items() if k not in DROPPED}
        return {k: v for k, v in out.items() if v is not None and v != []}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def error_view(body: Any) -> Any:
    """An OpenAI error body without its ``type`` (see the module docstring)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return {"error": {k: v for k, v in body["error"].items() if k != "type"}}
    return body


def differences(got: Any, want: Any, path: str = "") -> tuple[list[str], int]:
    """(the differing paths with both values, the number of leaves compared)."""
    if isinstance(want, dict) and isinstance(got, dict):
        diffs, count = [], 0
        for key in sorted(set(want) | set(got)):
            if key not in got or key not in want:
                side = "gateway lacks" if key not in got else "gateway adds"
                diffs.append(f"{path}.{key}: {side} {json.dumps(want.get(key, got.get(key)))[:200]}")
                count += 1
                continue
            d, c = differences(got[key], want[key], f"{path}.{key}")
            diffs += d
            count += c
        return diffs, count
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(got)} items through the gateway, {len(want)} direct"], 1
        diffs, count = [], 0
        for i, (g, w) in enumerate(zip(got, want)):
            d, c = differences(g, w, f"{path}[{i}]")
            diffs += d
            count += c
        return diffs, count
    if got != want:
        return [f"{path}: gateway {json.dumps(got)[:200]} != direct {json.dumps(want)[:200]}"], 1
    return [], 1


def sse_events(text: str) -> list[Any]:
    return [json.loads(line[5:]) for line in text.splitlines()
            if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def fold_sse(text: str) -> dict[str, Any]:
    """An OpenAI stream (chat or completions) as one body: per choice index its joined text (or
    content), tool calls, logprobs entries, finish and stop reasons; the usage; or the error event."""
    choices: dict[int, dict[str, Any]] = {}
    usage = error = None
    for event in sse_events(text):
        if "error" in event:
            error = event
            continue
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            _fold_choice(choices.setdefault(choice["index"], {"text": "", "logprobs": []}), choice)
    if error is not None:
        return error_view(error)
    return {"model": first.get("model") if (first := next(iter(sse_events(text)), {})) else None,
            "choices": [choices[i] for i in sorted(choices)], "usage": usage}


def _fold_choice(into: dict[str, Any], choice: dict[str, Any]) -> None:
    delta = choice.get("delta") or {}
    into["text"] += choice.get("text") or delta.get("content") or ""
    for call in delta.get("tool_calls") or []:
        calls = into.setdefault("tool_calls", {})
        slot = calls.setdefault(call["index"], {"name": "", "arguments": ""})
        function = call.get("function") or {}
        slot["name"] += function.get("name") or ""
        slot["arguments"] += function.get("arguments") or ""
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        if "content" in logprobs:
            into["logprobs"] += logprobs["content"] or []
        else:
            into["logprobs"] += [list(x) for x in zip(*(logprobs[k] for k in ("tokens", "token_logprobs",
                                                                              "top_logprobs", "text_offset")))]
    for key in ("finish_reason", "stop_reason", "prompt_logprobs"):
        if choice.get(key) is not None:
            into[key] = choice[key]

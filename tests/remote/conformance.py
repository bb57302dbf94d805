"""Field-by-field comparison of an answer through ``infer serve`` with the same request sent to vLLM
directly (tests/remote/test_vllm_conformance.py).

A non-streamed body is compared leaf by leaf after :func:`normalize`; a stream is first folded into
one body per choice (:func:`fold_sse`): the texts joined, the logprobs entries joined, the last
``finish_reason``/``stop_reason`` and the usage chunk. Chunk boundaries are not compared (the gateway
sends the role with the first text, vLLM in a chunk of its own).

What ``normalize`` drops, and why (each a documented difference, README "vLLM: what reaches the client"):

- per-response values: ``id`` (also an output item's or a ``tool_use`` block's), ``created``,
  ``created_at``, a call's ``call_id``; ``system_fingerprint`` (``fp_infer`` here, vLLM's version there);
- the gateway's additions: ``usage.cost_usd`` (a priced backend);
- fields whose value is ``null``, an empty list or an empty object: vLLM writes every field of its
  response models (``refusal``, ``audio``, ``kv_transfer_params``, ``tool_calls: []``, a Response's
  ``metadata: null``, …); the gateway leaves out what it has no value for, or writes OpenAI's empty
  value (a Response's ``metadata: {}``, ``reasoning: {"effort": null, "summary": null}``);
- vLLM's extensions the gateway does not carry: ``usage.prompt_tokens_details.created_cache_tokens``
  and ``multimodal_tokens``; a Response's ``usage.input_tokens_details.cache_write_tokens`` and
  ``usage.output_tokens_details.tool_output_tokens`` (0 without tools that run on the server);
- a message's ``content: ""`` beside its ``tool_calls``: vLLM writes it after a named call
  (``chat_completion/serving.py``), the gateway ``null``, as OpenAI;
- an error's ``type``: the gateway answers in OpenAI's types (``invalid_request_error``), or Anthropic's
  on ``/v1/messages``; vLLM names the exception (``BadRequestError``); message, param and code are
  compared.

Anthropic streams are folded by :func:`fold_anthropic` (the ``ping`` event left out: the gateway sends
it as Anthropic does, vLLM does not), Responses streams by :func:`fold_responses`, and a Response, whole
or folded, goes through :func:`responses_view` (the echoes that differ by design).
"""

from __future__ import annotations

import json
from typing import Any

DROPPED = frozenset({"id", "created", "created_at", "call_id", "system_fingerprint", "cost_usd", "created_cache_tokens",
                     "multimodal_tokens", "cache_write_tokens", "tool_output_tokens"})


def normalize(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: normalize(v) for k, v in value.items() if k not in DROPPED}
        if out.get("tool_calls") and out.get("content") == "":
            out["content"] = None
        return {k: v for k, v in out.items() if v is not None and v != [] and v != {}}
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


def anthropic_error_view(body: Any) -> Any:
    """An Anthropic error body without its ``error.type`` (vLLM names the exception, the gateway
    Anthropic's type); the message is compared, with ``max_completion_tokens`` read as ``max_tokens``
    (vLLM's Anthropic route names the chat field it translated ``max_tokens`` into,
    ``anthropic/serving.py``; the gateway the field the client sent)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = {k: v for k, v in body["error"].items() if k != "type"}
        if isinstance(error.get("message"), str):
            error["message"] = error["message"].replace("max_completion_tokens", "max_tokens")
        return {"type": body.get("type"), "error": error}
    return body


def fold_anthropic(text: str) -> dict[str, Any]:
    """An Anthropic Messages stream as one Message: ``message_start``'s message with the content
    blocks rebuilt from their start and deltas (texts joined, a ``tool_use`` block's
    ``partial_json`` joined and parsed into ``input``), ``message_delta``'s ``stop_reason``,
    ``stop_sequence`` and usage; ``message_start``'s usage as ``start_usage``; the event types in
    order, consecutive repeats once, without ``ping`` (the gateway sends one as Anthropic does, vLLM
    none); or the error event."""
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    kinds: list[str] = []
    for event in sse_events(text):
        kind = event.get("type")
        if kind == "error":
            return anthropic_error_view(event)
        if kind != "ping" and (not kinds or kinds[-1] != kind):
            kinds.append(kind)
        if kind == "message_start":
            message = {**event["message"], "start_usage": event["message"].get("usage")}
        elif kind == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif kind == "content_block_delta":
            _fold_block_delta(blocks[event["index"]], event["delta"])
        elif kind == "message_delta":
            message.update(event["delta"], usage=event.get("usage"))
    for block in blocks.values():
        if "partial_json" in block:
            block["input"] = json.loads(block.pop("partial_json") or "{}")
    return {**message, "content": [blocks[i] for i in sorted(blocks)], "events": kinds}


def _fold_block_delta(block: dict[str, Any], delta: dict[str, Any]) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta["text"]
    elif kind == "input_json_delta":
        block["partial_json"] = block.get("partial_json", "") + delta["partial_json"]
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta["thinking"]


def fold_responses(text: str) -> dict[str, Any]:
    """A Responses stream as one body: the final event's ``response``, the text and arguments its
    deltas joined to per output index (``deltas``), and the event types in order, consecutive repeats
    once; or the error event."""
    final: dict[str, Any] = {}
    deltas: dict[int, str] = {}
    kinds: list[str] = []
    for event in sse_events(text):
        kind = event.get("type", "")
        if kind == "error":
            return {"error": {k: v for k, v in event.items() if k not in ("type", "sequence_number")}}
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
        if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
            deltas[event["output_index"]] = deltas.get(event["output_index"], "") + event["delta"]
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            final = event["response"]
    return {**final, "deltas": [deltas[i] for i in sorted(deltas)], "events": kinds}


# a Response's fields each side echoes in its own way (see the module docstring)
RESPONSE_ECHOES = ("top_p", "presence_penalty", "frequency_penalty", "service_tier", "store", "text")
ENDS = ("response.completed", "response.incomplete")


def responses_view(body: dict[str, Any]) -> dict[str, Any]:
    """A Response (or a folded stream) without the echoes that differ by design: the sampling values
    (vLLM echoes what it applied, the gateway what was asked), ``service_tier`` (vLLM's echo; the
    gateway has no tiers), ``store`` (the gateway's), ``text`` (vLLM: null, or the schema it forced a
    named tool call with; the gateway the request's format), ``tool_choice`` without tools (vLLM
    "none", the gateway the request's, "auto" by default, as OpenAI), and the stream's last event's
    name (vLLM 0.32 ends every stream with ``response.completed``, ``responses/serving.py``; the
    gateway with ``response.incomplete`` when ``max_output_tokens`` cut it, as OpenAI)."""
    out = {k: v for k, v in body.items() if k not in RESPONSE_ECHOES}
    if not body.get("tools"):
        out.pop("tool_choice", None)
    if "events" in out:
        out["events"] = ["response.(end)" if kind in ENDS else kind for kind in out["events"]]
    return out


def shape(value: Any) -> Any:
    """A body's structure: keys and JSON types, the values left out (two models say different things)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__

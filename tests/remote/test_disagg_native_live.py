"""Our engine in both roles: two `infer serve` processes with the native engine speak vLLM's P/D fields
(``kv_transfer_params``), and a route drives them as it drives vLLM: the prefill worker answers where its
KV blocks are, the decode worker reads them from shared memory and computes only the rest of the prompt,
and the greedy answer equals the co-located one."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from core.base import Chunk, Done, GenerationRequest
from adapters.remote.base import RemoteSettings
from adapters.remote.registry import create_remote
from gateway.backends_config import RouteEntry
from routing.build import build_routes
from fakes.live import start_server, stop_server

pytestmark = pytest.mark.slow  # two infer serve processes with the native engine, twice: about 40 s

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12  # a few blocks of the tiny model's tokens


@pytest.fixture(scope="module", params=["f32", "bf16 prefill"])
def workers(request, tiny_store, tmp_path_factory):
    """Both workers with the same engine config: the default f32, or the bf16 prefill (layers/bf16_prefill.py,
    f32 where the CPU cannot prove it)."""
    native = '{"cpu_bf16_prefill": true}' if request.param == "bf16 prefill" else "{}"
    started = [start_server(tmp_path_factory.mktemp(f"native-{role}"), tiny_store.root, INFER_ENGINE="native",
                            INFER_KV_ROLE=role, INFER_NATIVE=native) for role in ("prefill", "decode")]
    try:
        yield started
    finally:
        for server in started:
            stop_server(server)


def completion(server, **body) -> dict:
    reply = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 12,
                                                              "temperature": 0, **body}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_native_prefill_leg_answers_with_kv_transfer_params_and_a_decode_leg_uses_them(workers):
    prefill, decode = workers
    colocated = completion(prefill)["choices"][0]["text"]  # the answer, computed in one place
    leg = completion(prefill, prompt=PROMPT + " Again:", max_tokens=1,
                     kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
    params = leg["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_block_ids"] and params["tp_size"] == 1
    answer = completion(decode, prompt=PROMPT + " Again:", kv_transfer_params=params)
    expected = completion(prefill, prompt=PROMPT + " Again:")  # prefill holds it cached: same tokens either way
    assert answer["choices"][0]["text"] == expected["choices"][0]["text"]
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == params["remote_num_tokens"]
    assert colocated


def test_a_worker_refuses_the_leg_its_role_does_not_take(workers):
    prefill, decode = workers
    for server, params in ((prefill, {"do_remote_prefill": True}), (decode, {"do_remote_decode": True})):
        reply = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1,
                                                                  "kv_transfer_params": params}, timeout=60)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "kv_transfer_params"


def test_a_route_over_native_workers_answers_as_one_worker_does(workers):
    prefill, decode = workers
    remotes = {name: create_remote(RemoteSettings(name=name, type="vllm", base_url=s.url, model="tiny"))
               for name, s in (("p", prefill), ("d", decode))}
    entry = RouteEntry.model_validate({"name": "chat", "prefill": {"protocol": "vllm", "backends": ["p"]},
                                       "decode": {"protocol": "vllm", "backends": ["d"]},
                                       "disagg": {"when": "always"}})
    route = build_routes([entry], remotes, lambda name: None)["chat"]
    prompt = PROMPT + " Once more, in other words:"

    async def go():
        request = GenerationRequest(model="chat", prompt=prompt, options={"num_predict": 12, "temperature": 0.0})
        try:
            events = [e async for e in route.stream(request)]
        finally:
            for backend in remotes.values():
                await backend.aclose()
        return "".join(e.text for e in events if isinstance(e, Chunk)), events[-1]
    text, done = asyncio.run(go())
    assert isinstance(done, Done) and (done.served_by, done.prefill_by) == ("d", "p")
    fresh = completion(prefill, prompt=prompt)["choices"][0]["text"]
    assert text == fresh

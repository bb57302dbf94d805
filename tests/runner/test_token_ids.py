"""A native runner, and a llama.cpp one for a vocabulary the gateway's tokenizer reads, gets token ids: the
gateway renders, tokenizes and admits once; tools and thinking are parsed in the gateway from the text the
runner streams back (``adapters/engines/runner/backend.py``)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from types import SimpleNamespace

import pytest

from adapters.engines.runner import protocol as p
from adapters.engines.runner.backend import runner_engines
from adapters.engines.runner.channel import BlockingChannel
from adapters.engines.runner.client import Launch
from adapters.engines.store_models import model_details
from core.base import Chunk, Done, GenerationRequest
from core.options import Options
from core.settings import LocalSettings
from frontend.prompt_ids import same_ids_as_llama_cpp
from gateway.serving.prompt_tokens import _local_count
from registry.store import Store

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello to the world."}]


async def _collect(backend, request: GenerationRequest) -> tuple[list[Chunk], Done]:
    chunks, done = [], None
    async for event in backend.stream(request):
        if isinstance(event, Done):
            done = event
        else:
            chunks.append(event)
    return chunks, done


def _admission(cap: int | None, asked: list[tuple]):
    async def admit(prompt_tokens: int, context: int | None, served_by: str | None = None) -> int | None:
        asked.append((prompt_tokens, context, served_by))
        return cap
    return admit


async def _two_requests(store, engine: str, first: GenerationRequest, second: GenerationRequest) -> list[tuple]:
    engines = runner_engines(store, LocalSettings(engine=engine, keep_alive=-1))
    try:
        return [await _collect(engines.get(engine), first), await _collect(engines.get(engine), second)]
    finally:
        await engines.aclose()


@pytest.mark.parametrize("engine", ["native", "llamacpp"])
def test_a_runner_runs_the_prompt_the_gateway_tokenized_and_admitted(tiny_store, engine):
    asked: list[tuple] = []
    keyed = GenerationRequest(model="tiny", messages=CHAT, options={"temperature": 0, "num_predict": 8},
                              admit=_admission(3, asked))
    long_chat = [{"role": "user", "content": "word " * 300}, {"role": "assistant", "content": "ok"},
                 {"role": "user", "content": "hi"}]
    truncated = GenerationRequest(model="tiny", messages=long_chat, truncate=True,
                                  options={"temperature": 0, "num_predict": 2, "num_ctx": 128})
    counted = _local_count(model_details(tiny_store, "tiny"), keyed)
    (chunks, done), (_, cut) = asyncio.run(_two_requests(tiny_store, engine, keyed, truncated))

    assert len(asked) == 1 and asked[0][0] == counted and asked[0][1] > counted and asked[0][2] == engine
    assert len(done.prompt_tokens) == counted == done.usage.input_tokens  # Ollama's "context": the ids sent
    assert done.usage.output_tokens == 3 and done.finish_reason == "length"  # the cap the gateway computed
    assert sum(len(c.token_ids) for c in chunks) == 3
    assert cut.truncated_messages >= 1 and cut.usage.input_tokens < 128  # dropped in the gateway, said in Done


@pytest.mark.parametrize(("model", "pre", "same"), [("gpt2", "qwen2", True), ("gpt2", None, True),
                                                  ("gpt2", "no-such-pre", False), ("llama", None, False)])
def test_llama_cpp_takes_ids_only_for_vocabularies_the_gateway_tokenizes_as_it_does(model, pre, same):
    meta = {"tokenizer.ggml.model": model, **({"tokenizer.ggml.pre": pre} if pre else {})}
    details = SimpleNamespace(model_path="m.gguf", gguf=SimpleNamespace(metadata=meta))
    assert same_ids_as_llama_cpp(details) is same


def test_a_llama_cpp_runner_takes_what_the_gateway_resolved_and_reads_no_store(tiny_store, tmp_path):
    """A ``Generate`` with ``resolved`` runs on the runner's loaded model with those options: the request's own
    options are not re-read, and neither is the store (its manifest gone, the request still runs); without
    ``resolved`` the runner looks the model up and says it is gone."""
    store = Store(shutil.copytree(tiny_store.root, tmp_path / "store"))
    weights = model_details(store, "tiny").base_digest
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    launch = Launch.single("llamacpp")
    command = [part.replace("{fd}", str(theirs.fileno())) for part in launch.commands[0]]
    proc = subprocess.Popen(command, env=launch.env, pass_fds=(theirs.fileno(),))
    theirs.close()
    channel = BlockingChannel(ours, p.from_runner)
    try:
        channel.send(p.Load("llamacpp", str(store.root), "tiny", {}, LocalSettings(keep_alive=-1).model_dump()))
        assert isinstance(channel.poll(120.0)[0], p.Ready)
        store.manifest_path(store.resolve("tiny")).unlink()

        options = Options(temperature=0, num_predict=5, ignore_eos=True).model_dump()
        request = GenerationRequest(model="tiny", prompt_tokens=[1, 2, 3, 4, 5, 6], options={"num_predict": 2})
        channel.send(p.Generate(1, p.request_to_wire(request), resolved=p.Resolved(options, weights)),
                     p.Generate(2, p.request_to_wire(request)))
        ends: dict[int, object] = {}
        while len(ends) < 2:
            for message in channel.poll(60.0):
                if isinstance(message, (p.Finished, p.Failed)):
                    ends[message.id] = message
        assert isinstance(ends[1], p.Finished) and ends[1].done.usage.output_tokens == 5
        assert isinstance(ends[2], p.Failed) and type(p.error_from_wire(ends[2].error)).__name__ == "ModelNotFound"
    finally:
        channel.send(p.Shutdown())
        assert proc.wait(timeout=30) == 0
        channel.close()

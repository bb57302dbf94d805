"""A native runner gets token ids: the gateway renders, tokenizes and admits once; tools and thinking are
parsed in the gateway from the text the runner streams back (``adapters/engines/runner/backend.py``)."""

from __future__ import annotations

import asyncio

from adapters.engines.runner.backend import runner_engines
from adapters.engines.store_models import model_details
from core.base import Chunk, Done, GenerationRequest
from core.settings import LocalSettings
from gateway.serving.prompt_tokens import _local_count

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


async def _two_requests(store, first: GenerationRequest, second: GenerationRequest) -> list[tuple]:
    engines = runner_engines(store, LocalSettings(engine="native", keep_alive=-1))
    try:
        return [await _collect(engines.get("native"), first), await _collect(engines.get("native"), second)]
    finally:
        await engines.aclose()


def test_a_native_runner_runs_the_prompt_the_gateway_tokenized_and_admitted(tiny_store):
    asked: list[tuple] = []
    keyed = GenerationRequest(model="tiny", messages=CHAT, options={"temperature": 0, "num_predict": 8},
                              admit=_admission(3, asked))
    long_chat = [{"role": "user", "content": "word " * 300}, {"role": "assistant", "content": "ok"},
                 {"role": "user", "content": "hi"}]
    truncated = GenerationRequest(model="tiny", messages=long_chat, truncate=True,
                                  options={"temperature": 0, "num_predict": 2, "num_ctx": 128})
    counted = _local_count(model_details(tiny_store, "tiny"), keyed)
    (chunks, done), (_, cut) = asyncio.run(_two_requests(tiny_store, keyed, truncated))

    assert len(asked) == 1 and asked[0][0] == counted and asked[0][1] > counted and asked[0][2] == "native"
    assert len(done.prompt_tokens) == counted == done.usage.input_tokens  # Ollama's "context": the ids sent
    assert done.usage.output_tokens == 3 and done.finish_reason == "length"  # the cap the gateway computed
    assert sum(len(c.token_ids) for c in chunks) == 3
    assert cut.truncated_messages >= 1 and cut.usage.input_tokens < 128  # dropped in the gateway, said in Done

"""Ollama generation: ``POST /api/generate``, ``/api/chat``, ``/api/embed`` and legacy ``/api/embeddings``.

Streaming answers are NDJSON, one object per line, ending with the ``done: true`` record that
carries the metrics; ``"stream": false`` answers one JSON object. No non-final chat chunk has an
empty ``message.content`` (the legacy ChatBox client throws on one): chunks without text are
skipped and their logprobs carried to the next chunk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.base import Chunk, GenerationRequest, TokenLogprob
from gateway.serving.router import Router

from gateway.ollama import views as view
from gateway.deps import CallerDep, ClientDep, RecorderDep, RouterDep, check_model
from gateway.http.disconnect import Receive, on_disconnect
from gateway.http.limits import ParsedBodyRoute, items, translated
from gateway.http.hints import HintsDep, RequestHints
from gateway.http.hot import hot_route
from gateway.http.errors import APIError
from gateway.http.jsonwire import JSONBytes, cost_header, note_header
from gateway.ollama.local import load_or_unload
from gateway.embeddings import embed as embed_inputs
from gateway.ollama.wire_models import chat_responses, embed_responses, embeddings_responses, generate_responses
from gateway.ollama.schemas import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, keep_alive_seconds
from gateway.serving.recorder import Generation, Recorder
from gateway.http.streaming import ndjson_response

router = APIRouter(tags=["ollama"], route_class=ParsedBodyRoute)


@router.post("/api/generate", responses=generate_responses())
async def generate(body: GenerateRequest, backends: RouterDep, recorder: RecorderDep, client: ClientDep,
                   hints: HintsDep, http: Request) -> Response:
    if body.images:
        raise APIError(400, "images are not supported", param="images")
    keep_alive = keep_alive_seconds(body.keep_alive)
    if not body.prompt:
        check_model(hints.caller, body.model)
        reason = await load_or_unload(backends, body.model, keep_alive, body.sampling_options, engine=body.engine)
        return JSONBytes(view.load_answer(body.model, reason, chat=False))
    req = GenerationRequest(
        model=body.model, engine=body.engine, prompt=body.prompt, system=body.system, template=body.template,
        raw=body.raw, suffix=body.suffix, options=body.sampling_options, format=body.format,
        logprobs=body.logprobs, top_logprobs=body.top_logprobs, truncate=bool(body.truncate),
        keep_alive=keep_alive, client=client, think=body.think, templated=True, timed=True)
    hints.apply(req)
    backend = recorder.resolve(backends, req, route="/api/generate", stream=body.streaming)
    if body.streaming:
        gen = await recorder.start(backend, req, route="/api/generate", stream=True)
        return ndjson_response(_generate_stream(gen, body), more_ready=gen.more_ready, headers=note_header([gen]))
    async with on_disconnect(http.receive, req.cancel.cancel):  # from the start: a reply may take long to come
        gen = await recorder.start(backend, req, route="/api/generate", stream=False)
        text, chunks, done = await gen.collect()
    final = with_cost(view.generate_final(body.model, done, text=text, raw=body.raw, logprobs=_logprobs(chunks),
                                          thinking=_thinking(chunks)), gen)
    return JSONBytes(final, headers=cost_header(gen.cost_usd, [gen]))


async def _generate_stream(gen: Generation, body: GenerateRequest) -> AsyncIterator[dict]:
    async for kind, text, logprobs, done in _pieces(gen):
        if kind == "chunk":
            yield view.generate_chunk(body.model, text, logprobs)
        elif kind == "thinking":
            yield view.generate_chunk(body.model, "", logprobs, thinking=text)
        else:
            yield with_cost(view.generate_final(body.model, done, raw=body.raw, logprobs=logprobs), gen)


@router.post("/api/chat", responses=chat_responses())
async def chat(body: ChatRequest, backends: RouterDep, recorder: RecorderDep, client: ClientDep,
               hints: HintsDep, http: Request) -> Response:
    return await serve_chat(body, backends, recorder, client, hints, http.receive)


async def serve_chat(body: ChatRequest, backends: Router, recorder: Recorder, client: str | None,
                     hints: RequestHints, receive: Receive) -> Response:
    messages = body.messages or []
    if any(m.images for m in messages):
        raise APIError(400, "images are not supported", param="messages.images")
    keep_alive = keep_alive_seconds(body.keep_alive)
    if not messages:
        check_model(hints.caller, body.model)
        reason = await load_or_unload(backends, body.model, keep_alive, body.sampling_options, engine=body.engine)
        return JSONBytes(view.load_answer(body.model, reason, chat=True))
    req = GenerationRequest(
        model=body.model, engine=body.engine,
        messages=await translated(body.backend_messages, items=items(body.messages, body.tools)),
        options=body.sampling_options, format=body.format, logprobs=body.logprobs, top_logprobs=body.top_logprobs,
        truncate=bool(body.truncate), keep_alive=keep_alive, client=client, tools=body.tools, think=body.think,
        timed=True)
    hints.apply(req)
    backend = recorder.resolve(backends, req, route="/api/chat", stream=body.streaming)
    if body.streaming:
        gen = await recorder.start(backend, req, route="/api/chat", stream=True)
        return ndjson_response(_chat_stream(gen, body.model), more_ready=gen.more_ready, headers=note_header([gen]))
    async with on_disconnect(receive, req.cancel.cancel):  # from the start: a reply may take long to come
        gen = await recorder.start(backend, req, route="/api/chat", stream=False)
        text, chunks, done = await gen.collect()
    calls = [call for chunk in chunks for call in chunk.tool_calls]
    final = view.chat_final(body.model, done, text=text, logprobs=_logprobs(chunks), tool_calls=calls,
                            thinking=_thinking(chunks))
    return JSONBytes(with_cost(final, gen), headers=cost_header(gen.cost_usd, [gen]))


async def _chat_stream(gen: Generation, model: str) -> AsyncIterator[dict]:
    calls = 0
    async for kind, text, logprobs, done in _pieces(gen, with_calls=True):
        if kind == "chunk":
            yield view.chat_chunk(model, text, logprobs)
        elif kind == "thinking":
            yield view.chat_chunk(model, "", logprobs, thinking=text)
        elif kind == "calls":  # Ollama sends a model's calls in a chunk of their own
            yield view.chat_chunk(model, "", logprobs, tool_calls=text, first_index=calls)
            calls += len(text)
        else:
            yield with_cost(view.chat_final(model, done, logprobs=logprobs), gen)


async def _pieces(gen: Generation, *, with_calls: bool = False):
    """("thinking", thinking, logprobs, None) for every chunk with thinking (before its text),
    ("chunk", text, logprobs, None) for every chunk with text, ("calls", tool calls, logprobs, None)
    for every chunk with tool calls (``with_calls``), then ("done", "", logprobs, done).

    Logprobs of chunks without text (an incomplete UTF-8 sequence, a held-back stop prefix) ride
    on the next chunk that has text, or on the final record."""
    pending: list[TokenLogprob] = []
    async for event in gen:
        if isinstance(event, Chunk):
            pending.extend(event.logprobs or [])
            if event.thinking:
                yield "thinking", event.thinking, pending, None
                pending = []
            if event.text:
                yield "chunk", event.text, pending, None
                pending = []
            if with_calls and event.tool_calls:
                yield "calls", event.tool_calls, pending, None
                pending = []
        else:
            yield "done", "", pending, event


def with_cost(final: dict, gen: Generation) -> dict:
    """The final record with ``cost_usd`` (an extra field clients ignore) when the backend is priced."""
    return final if gen.cost_usd is None else {**final, "cost_usd": round(gen.cost_usd, 12)}


def _thinking(chunks: list[Chunk]) -> str:
    return "".join(c.thinking for c in chunks)


def _logprobs(chunks: list[Chunk]) -> list[TokenLogprob]:
    return [lp for c in chunks for lp in (c.logprobs or [])]


# -- embeddings -----------------------------------------------------------------------------------

@router.post("/api/embed", responses=embed_responses(), response_model=None)
async def embed(body: EmbedRequest, backends: RouterDep, recorder: RecorderDep, client: ClientDep,
                who: CallerDep) -> dict:
    keep_alive = keep_alive_seconds(body.keep_alive)
    if body.input is None:
        raise APIError(400, "'input' is required: a string or a list of strings to embed (an empty one "
                            "loads the model)", param="input")
    inputs = ([body.input] if body.input else []) if isinstance(body.input, str) else list(body.input)
    check_model(who, body.model)
    if not inputs:
        await load_or_unload(backends, body.model, keep_alive, body.options or {}, embedding=True)
        return {"model": body.model, "embeddings": []}
    result = await embed_inputs(backends.resolve_embedding(body.model), recorder, route="/api/embed", model=body.model, inputs=inputs,
                                client=client, truncate=body.truncate, keep_alive=keep_alive,
                                dimensions=body.dimensions, caller=who)
    return {"model": body.model, "embeddings": result.embeddings, "total_duration": view.ns(result.total),
            "load_duration": view.ns(result.load), "prompt_eval_count": result.input_tokens}


@router.post("/api/embeddings", responses=embeddings_responses(), response_model=None)
async def embeddings(body: EmbeddingsRequest, backends: RouterDep, recorder: RecorderDep,
                     client: ClientDep, who: CallerDep) -> dict:
    keep_alive = keep_alive_seconds(body.keep_alive)
    check_model(who, body.model)
    if not body.prompt:
        await load_or_unload(backends, body.model, keep_alive, body.options or {}, embedding=True)
        return {"embedding": []}
    result = await embed_inputs(backends.resolve_embedding(body.model), recorder, route="/api/embeddings", model=body.model,
                                inputs=[body.prompt], client=client, keep_alive=keep_alive, caller=who)
    return {"embedding": result.embeddings[0]}


hot_chat = hot_route(ChatRequest, serve_chat)  # ``POST /api/chat`` without FastAPI's routing (gateway/http/hot.py)

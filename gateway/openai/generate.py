"""OpenAI generation: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Requests are mapped onto the backend in ``gateway/openai/schemas.py``; the backend is resolved
once per HTTP request, and every choice (``n``) is its own generation through the recorder (one
ledger row each). Streams are SSE (``data: {json}\\n\\n`` … ``data: [DONE]``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.serving.router import Router

from gateway.deps import ClientDep, RecorderDep, RouterDep
from gateway.http.disconnect import Receive, on_disconnect
from gateway.http.limits import ParsedBodyRoute, items, translated
from gateway.http.hints import HintsDep, RequestHints
from gateway.http.hot import hot_route
from gateway.serving.recorder import Recorder
from gateway.http.jsonwire import JSONBytes, cost_header, note_header
from gateway.http.streaming import sse_response
from gateway.openai.responses import ResponseMeta, chat_completion, text_completion
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from gateway.openai.stream import chat_chunks, completion_chunks, run_all, start_stream, total_cost
from gateway.openai.wire_models import chat_responses, completion_responses

router = APIRouter(tags=["openai"], route_class=ParsedBodyRoute)

CHAT_ROUTE = "/v1/chat/completions"
COMPLETIONS_ROUTE = "/v1/completions"


@router.post(CHAT_ROUTE, responses=chat_responses())
async def chat_completions(body: ChatCompletionRequest, backends: RouterDep, recorder: RecorderDep,
                           client: ClientDep, hints: HintsDep, http: Request):
    return await serve_chat(body, backends, recorder, client, hints, http.receive)


async def serve_chat(body: ChatCompletionRequest, backends: Router, recorder: Recorder, client: str | None,
                     hints: RequestHints, receive: Receive) -> Response:
    translated_requests = await translated(body.generation_requests, client, items=items(body.messages, body.tools))
    requests = [hints.apply(r) for r in translated_requests]
    backend = recorder.resolve(backends, requests[0], route=CHAT_ROUTE, stream=bool(body.stream))
    meta = ResponseMeta("chat.completion", body.model, named_call=isinstance(body.tool_choice, NamedToolChoice))
    logprobs = bool(body.logprobs)
    if body.stream:
        gens: list = []
        events, more_ready = await start_stream(recorder, backend, requests, CHAT_ROUTE, gens)
        return sse_response(chat_chunks(meta, events, logprobs=logprobs, include_usage=body.include_usage,
                                        cost=lambda: total_cost(gens)), more_ready, headers=note_header(gens))
    gens = []
    async with on_disconnect(receive, lambda: [r.cancel.cancel() for r in requests]):
        results = await run_all(recorder, backend, requests, CHAT_ROUTE, gens)
    return JSONBytes(chat_completion(meta, results, logprobs=logprobs), headers=cost_header(total_cost(gens), gens))


@router.post(COMPLETIONS_ROUTE, responses=completion_responses())
async def completions(body: CompletionRequest, backends: RouterDep, recorder: RecorderDep, client: ClientDep,
                      hints: HintsDep, http: Request):
    pairs = body.generation_requests(client)
    prompt_of = [p for p, _ in pairs]
    requests = [hints.apply(req) for _, req in pairs]
    backend = recorder.resolve(backends, requests[0], route=COMPLETIONS_ROUTE, stream=bool(body.stream))
    body.check_echo(backend)
    meta = ResponseMeta("text_completion", body.model)
    logprobs = body.logprobs is not None
    if body.stream:
        gens: list = []
        events, more_ready = await start_stream(recorder, backend, requests, COMPLETIONS_ROUTE, gens)
        return sse_response(completion_chunks(meta, events, prompt_of, logprobs=logprobs,
                                              include_usage=body.include_usage, cost=lambda: total_cost(gens)),
                            more_ready, headers=note_header(gens))
    gens = []
    async with on_disconnect(http.receive, lambda: [r.cancel.cancel() for r in requests]):
        results = await run_all(recorder, backend, requests, COMPLETIONS_ROUTE, gens)
    return JSONBytes(text_completion(meta, results, prompt_of, logprobs=logprobs),
                     headers=cost_header(total_cost(gens), gens))


hot_chat = hot_route(ChatCompletionRequest, serve_chat)  # ``POST /v1/chat/completions`` without FastAPI's routing (gateway/http/hot.py)

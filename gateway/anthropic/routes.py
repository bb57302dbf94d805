"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

The body is translated once (``gateway/anthropic/schemas.py``) into a ``GenerationRequest`` that takes
the path every request takes: ``Recorder.resolve`` (``Router.resolve``, once) → the backend's stream →
one ledger row (route ``/v1/messages``), so routes, SLOs, keys, budgets, costs and the dashboard see
these requests like any other. Errors, before the stream or inside it (an ``error`` event), are in
Anthropic's shape (``gateway/http/errors.py``). Keys are read from ``x-api-key`` as well as
``Authorization: Bearer``; the ``anthropic-version`` header is accepted and not checked.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.anthropic import views
from gateway.anthropic.schemas import CountTokensRequest, MessagesRequest
from gateway.anthropic.wire_models import count_responses, messages_responses
from gateway.deps import CallerDep, ClientDep, RecorderDep, RouterDep, check_model
from gateway.http.disconnect import on_disconnect
from gateway.http.errors import anthropic_error, to_status_message
from gateway.http.hints import HintsDep
from gateway.http.limits import ParsedBodyRoute, items, translated
from gateway.http.jsonwire import JSONBytes, cost_header
from gateway.http.streaming import event_stream_response
from gateway.serving.prompt_tokens import prompt_tokens

router = APIRouter(tags=["anthropic"], route_class=ParsedBodyRoute)

MESSAGES_ROUTE = "/v1/messages"
COUNT_ROUTE = "/v1/messages/count_tokens"


@router.post(MESSAGES_ROUTE, responses=messages_responses())
async def messages(body: MessagesRequest, backends: RouterDep, recorder: RecorderDep, client: ClientDep,
                   hints: HintsDep, http: Request) -> Response:
    request = hints.apply(await translated(body.generation_request, client, items=items(body.messages, body.tools)))
    stream = bool(body.stream)
    backend = recorder.resolve(backends, request, route=MESSAGES_ROUTE, stream=stream)
    msg_id = views.message_id()
    if stream:
        gen = await recorder.start(backend, request, route=MESSAGES_ROUTE, stream=True)
        events = views.stream_events(msg_id, body.model, gen.__aiter__(), body.stop_sequences)
        return event_stream_response(events, error=_error_event, last=frozenset({"message_stop"}),
                                     more_ready=gen.more_ready)
    async with on_disconnect(http.receive, request.cancel.cancel):  # from the start: a reply may take long to come
        gen = await recorder.start(backend, request, route=MESSAGES_ROUTE, stream=False)
        _, chunks, done = await gen.collect()
    answer = views.message(msg_id, body.model, chunks, done, body.stop_sequences)
    return JSONBytes(answer, headers=cost_header(gen.cost_usd))


@router.post(COUNT_ROUTE, responses=count_responses())
async def count_tokens(body: CountTokensRequest, backends: RouterDep, client: ClientDep, who: CallerDep) -> Response:
    check_model(who, body.model)
    request = await translated(body.translated, client, items=items(body.messages, body.tools))
    return JSONBytes({"input_tokens": await prompt_tokens(backends, request)})


def _error_event(exc: Exception) -> tuple[str, dict]:
    status, message, _ = to_status_message(exc)
    return "error", anthropic_error(status, message)

"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{response_id}``.

The body is translated once (``gateway/openai/responses_api.py``) and takes the path every request takes:
``Recorder.resolve`` → the backend's stream → one ledger row (route ``/v1/responses``). With ``store``
(the default, as OpenAI) the answer and the conversation it ends are saved in the ledger database
(``ledger/responses.py``) before the client sees the final event, for ``previous_response_id`` and
``GET``; ``INFER_RESPONSES_RETENTION`` says for how long (0: nothing is stored). Database work runs
in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from ledger import responses as store

from gateway.deps import ClientDep, DbDep, RecorderDep, RouterDep, SettingsDep, ViewerDep
from gateway.http.disconnect import on_disconnect
from gateway.http.errors import APIError, to_status_message
from gateway.http.hints import HintsDep
from gateway.http.limits import ParsedBodyRoute, items, translated
from gateway.http.jsonwire import JSONBytes, cost_header
from gateway.http.streaming import event_stream_response
from gateway.openai import responses_views as views
from gateway.openai.responses_api import ResponsesRequest, input_messages
from gateway.openai.wire_models import responses_responses, stored_response_responses

router = APIRouter(tags=["openai"], route_class=ParsedBodyRoute)

RESPONSES_ROUTE = "/v1/responses"
_LAST = frozenset({"response.completed", "response.incomplete", "response.failed"})


@router.post(RESPONSES_ROUTE, responses=responses_responses())
async def create_response(body: ResponsesRequest, backends: RouterDep, recorder: RecorderDep, client: ClientDep,
                          hints: HintsDep, db: DbDep, settings: SettingsDep, viewer: ViewerDep,
                          http: Request) -> Response:
    history = await _history(db, body.previous_response_id, viewer)
    request = hints.apply(await translated(body.generation_request, history, client,
                                           items=items(body.input, body.tools)))
    stream = bool(body.stream)
    backend = recorder.resolve(backends, request, route=RESPONSES_ROUTE, stream=stream)
    meta = views.ResponseMeta(body.model, views.settings_of(body))
    keep = _keeper(db, body, history, settings.responses_retention, getattr(hints.caller, "name", None))
    if stream:
        gen = await recorder.start(backend, request, route=RESPONSES_ROUTE, stream=True)
        events = views.stream_events(meta, gen.__aiter__(), keep, _failure)
        return event_stream_response(events, error=lambda exc: ("error", _error_event(exc)), last=_LAST,
                                     more_ready=gen.more_ready)
    async with on_disconnect(http.receive, request.cancel.cancel):  # from the start: a reply may take long to come
        gen = await recorder.start(backend, request, route=RESPONSES_ROUTE, stream=False)
        _, chunks, done = await gen.collect()
    answer = meta.snapshot(views.status_of(done), views.output_items(chunks), done)
    await keep(answer)
    return JSONBytes(answer, headers=cost_header(gen.cost_usd))


@router.get(RESPONSES_ROUTE + "/{response_id}", responses=stored_response_responses())
async def get_response(response_id: str, db: DbDep, viewer: ViewerDep) -> Response:
    found = await asyncio.to_thread(store.load, db, response_id, None, viewer)
    if found is None:
        raise _not_found(response_id, "response_id")
    return JSONBytes(found.body)


@router.delete(RESPONSES_ROUTE + "/{response_id}", responses=stored_response_responses(deleted=True))
async def delete_response(response_id: str, db: DbDep, viewer: ViewerDep) -> Response:
    if not await asyncio.to_thread(store.delete, db, response_id, viewer):
        raise _not_found(response_id, "response_id")
    return JSONBytes({"id": response_id, "object": "response.deleted", "deleted": True})


async def _history(db, previous_id: str | None, viewer: str | None) -> list[dict[str, Any]]:
    """The conversation ``previous_id`` ended: a caller's key continues only its own responses."""
    if previous_id is None:
        return []
    found = await asyncio.to_thread(store.load, db, previous_id, None, viewer)
    if found is None:
        raise _not_found(previous_id, "previous_response_id")
    return found.conversation


def _keeper(db, body: ResponsesRequest, history: list[dict[str, Any]], retention_s: float, key_name: str | None):
    """What stores a finished response (nothing with ``store: false`` or a zero retention)."""
    async def keep(answer: dict[str, Any]) -> None:
        if body.store is False or retention_s <= 0 or answer["status"] == "failed":
            return
        conversation = [*history, *input_messages(body.input), *views.conversation_tail(answer["output"])]
        await asyncio.to_thread(store.save, db, answer, conversation, retention_s, None, key_name)
    return keep


def _not_found(response_id: str, param: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found (never stored, deleted, or past its "
                         "retention).", param=param)


def _failure(exc: Exception) -> tuple[str, str]:
    """A failed stream's ``error``: (code, message)."""
    status, message, extra = to_status_message(exc)
    return extra.get("code") or ("server_error" if status >= 500 else "invalid_request"), message


def _error_event(exc: Exception) -> dict:
    """What cannot even end as ``response.failed`` (a failure outside the backend's stream)."""
    code, message = _failure(exc)
    return {"type": "error", "sequence_number": 0, "code": code, "message": message, "param": None}

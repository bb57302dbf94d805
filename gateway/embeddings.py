"""Embedding requests for both APIs: one backend call, the ``dimensions`` cut, one ledger row.

``/api/embed``, ``/api/embeddings`` and ``/v1/embeddings`` differ only in their wire shapes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from core.base import Backend, EmbedResult

from gateway.policy.admission import Admission
from gateway.http.errors import APIError, to_status_message
from gateway.observability.monitor import backend_label
from gateway.serving.recorder import Recorder
from ledger.tables import UsageRecord


async def embed(backend: Backend, recorder: Recorder, *, route: str, model: str, inputs: list[str],
                client: str | None, truncate: bool = True, keep_alive: float | None = None,
                dimensions: int | None = None, caller: Any = None) -> EmbedResult:
    """Embed ``inputs`` on ``backend`` (the router's pick); the ledger gets a row also when the request fails.
    A ledger key's name goes on the row, and its requests per minute are counted (and its tokens, when
    the request ends)."""
    if any(not text for text in inputs):  # llama.cpp cannot decode an empty input (and must not be asked to)
        raise APIError(400, "'input' must not contain empty strings", param="input")
    if not backend.supports_embeddings:
        raise APIError(400, f"the {backend.name} backend does not serve embeddings", param="model")
    key = getattr(caller, "key", None)
    label = backend_label(backend)  # a remote's entry name, as generation rows have it
    record = UsageRecord(source="gateway", route=route, model=model, backend=label, client=client,
                         key_name=getattr(key, "name", None))
    admission = None if key is None or recorder.keys is None else Admission(recorder.keys, key, None)
    tracer = recorder.tracer
    span = None if tracer is None else tracer.start_embedding(model, endpoint=route, backend=backend, label=label)
    t0 = time.perf_counter()
    try:
        if admission is not None:
            await admission.start()
        result = await _embed(backend, model, inputs, truncate, keep_alive, span, tracer)
        if dimensions:
            result = dataclasses.replace(result, embeddings=[resize(v, dimensions) for v in result.embeddings])
    except Exception as exc:
        record.status, record.error = "error", to_status_message(exc)[1]
        recorder.record(record, backend=label, error_type=type(exc).__name__, span=span)
        raise
    record.input_tokens = result.input_tokens
    record.total_ms = round((time.perf_counter() - t0) * 1000, 3)
    recorder.settle_key(admission, record)
    recorder.record(record, backend=label, span=span)
    return result


async def _embed(backend: Backend, model: str, inputs: list, truncate: bool, keep_alive: float | None,
                 span, tracer) -> EmbedResult:
    """The backend's call, with the request's span current (a remote adapter propagates it)."""
    if span is None:
        return await backend.embed(model, inputs, truncate=truncate, keep_alive=keep_alive)
    token = tracer.attach(tracer.context_of(span))
    try:
        return await backend.embed(model, inputs, truncate=truncate, keep_alive=keep_alive)
    finally:
        tracer.detach(token)


def resize(vector: list[float], dimensions: int) -> list[float]:
    """Keep the first ``dimensions`` values and renormalise to unit length (Matryoshka-style)."""
    if dimensions > len(vector):
        raise APIError(400, f"'dimensions' is {dimensions} but the model's embeddings have {len(vector)}",
                       param="dimensions")
    head = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head] if norm > 0 else head

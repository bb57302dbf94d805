"""OpenAI models and embeddings: ``GET /v1/models``, ``GET /v1/models/{model}``, ``POST /v1/embeddings``.

``owned_by`` is the model's namespace (``library`` for ``tiny:latest``) and ``created`` its
manifest's mtime, as Ollama answers. Embedding requests write one usage-ledger row each.
"""

from __future__ import annotations

import base64
import math
import struct
import time

from fastapi import APIRouter, Request

from adapters.base import ModelInfo
from registry.errors import RegistryError
from registry.names import parse_name

from ..deps import BackendDep, ClientDep, RecorderDep
from ..errors import APIError, to_status_message
from ..openai_schemas import EmbeddingRequest, parse_body
from ..usage import UsageRecord

router = APIRouter(tags=["openai"])

EMBEDDINGS_ROUTE = "/v1/embeddings"


def _name(info: ModelInfo) -> str:
    return getattr(info.name, "display", info.name)  # a registry ModelName or a plain string


def _canonical(text: str) -> str:
    try:
        return parse_name(text, insecure=True).full.lower()
    except RegistryError:
        return text.lower()


def _model_object(info: ModelInfo) -> dict:
    name = _name(info)
    try:
        owner = parse_name(name, insecure=True).namespace
    except RegistryError:
        owner = info.backend
    return {"id": name, "object": "model", "created": int(info.modified), "owned_by": owner}


@router.get("/v1/models")
async def list_models(backend: BackendDep) -> dict:
    return {"object": "list", "data": [_model_object(m) for m in await backend.list_models()]}


@router.get("/v1/models/{model:path}")
async def get_model(model: str, backend: BackendDep) -> dict:
    wanted = _canonical(model)
    for info in await backend.list_models():
        if _canonical(_name(info)) == wanted:
            return _model_object(info)
    raise APIError(404, f"model '{model}' not found", param="model", code="model_not_found")


@router.post(EMBEDDINGS_ROUTE)
async def embeddings(request: Request, backend: BackendDep, recorder: RecorderDep, client: ClientDep) -> dict:
    body = await parse_body(request, EmbeddingRequest)
    inputs = body.inputs()
    if not backend.supports_embeddings:
        raise APIError(400, f"the {backend.name} backend does not serve embeddings", param="model")
    record = UsageRecord(source="gateway", route=EMBEDDINGS_ROUTE, model=body.model, backend=backend.name,
                         client=client)
    t0 = time.perf_counter()
    try:
        result = await backend.embed(body.model, inputs, truncate=True)
        vectors = [_resize(v, body.dimensions) for v in result.embeddings]
    except Exception as exc:
        record.status, record.error = "error", to_status_message(exc)[1]
        recorder.record(record)
        raise
    record.input_tokens = result.input_tokens
    record.total_ms = round((time.perf_counter() - t0) * 1000, 3)
    recorder.record(record)
    encode = _base64 if body.encoding_format == "base64" else list
    return {"object": "list", "model": body.model,
            "data": [{"object": "embedding", "embedding": encode(v), "index": i} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": result.input_tokens, "total_tokens": result.input_tokens}}


def _resize(vector: list[float], dimensions: int | None) -> list[float]:
    """Keep the first ``dimensions`` values and renormalise to unit length (Matryoshka-style)."""
    if dimensions is None:
        return vector
    if dimensions > len(vector):
        raise APIError(400, f"'dimensions' is {dimensions} but the model's embeddings have {len(vector)}",
                       param="dimensions")
    head = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head] if norm > 0 else head


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")

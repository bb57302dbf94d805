"""OpenAI models and embeddings: ``GET /v1/models``, ``GET /v1/models/{model}``, ``POST /v1/embeddings``.

``owned_by`` is the model's namespace (``library`` for ``tiny:latest``) and ``created`` its
manifest's mtime, as Ollama answers. Embedding requests write one usage-ledger row each.
"""

from __future__ import annotations

import base64
import struct

from fastapi import APIRouter

from core.base import ModelInfo
from registry.errors import RegistryError
from registry.names import parse_name

from gateway.deps import CallerDep, ClientDep, RecorderDep, RouterDep, check_model
from gateway.embeddings import embed as embed_inputs
from gateway.http.errors import APIError
from gateway.openai.schemas import EmbeddingRequest
from gateway.openai.wire_models import embedding_responses, model_responses, models_responses

router = APIRouter(tags=["openai"])

EMBEDDINGS_ROUTE = "/v1/embeddings"


def _canonical(text: str) -> str:
    try:
        return parse_name(text, insecure=True).full.lower()
    except RegistryError:
        return text.lower()


def _model_object(info: ModelInfo) -> dict:
    """A LoRA adapter's object also names its base model (``parent``), as vLLM's does."""
    name, owner = info.name, info.owned_by
    if not owner:
        try:
            owner = parse_name(name, insecure=True).namespace
        except RegistryError:
            owner = info.backend
    card = {"id": name, "object": "model", "created": int(info.modified), "owned_by": owner}
    return card if info.parent is None else {**card, "parent": info.parent}


@router.get("/v1/models", responses=models_responses(), response_model=None)
async def list_models(backends: RouterDep) -> dict:
    return {"object": "list", "data": [_model_object(m) for m in await backends.list_models()]}


@router.get("/v1/models/{model:path}", responses=model_responses(), response_model=None)
async def get_model(model: str, backends: RouterDep, who: CallerDep) -> dict:
    check_model(who, model)
    wanted = _canonical(model)
    for info in await backends.list_models():
        if _canonical(info.name) == wanted:
            return _model_object(info)
    raise APIError(404, f"model '{model}' not found", param="model", code="model_not_found")


@router.post(EMBEDDINGS_ROUTE, responses=embedding_responses(), response_model=None)
async def embeddings(body: EmbeddingRequest, backends: RouterDep, recorder: RecorderDep, client: ClientDep,
                     who: CallerDep) -> dict:
    check_model(who, body.model)
    inputs = body.inputs()
    result = await embed_inputs(backends.resolve_embedding(body.model), recorder, route=EMBEDDINGS_ROUTE, model=body.model, inputs=inputs,
                                client=client, dimensions=body.dimensions, caller=who)
    vectors = result.embeddings
    encode = _base64 if body.encoding_format == "base64" else list
    return {"object": "list", "model": body.model,
            "data": [{"object": "embedding", "embedding": encode(v), "index": i} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": result.input_tokens, "total_tokens": result.input_tokens}}


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")

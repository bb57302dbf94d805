"""``/openapi.json`` declares what each route answers, so the fuzz tier has something to check.

Every JSON answer has a schema (no ``{}``), validation errors are documented as the 400 the app
sends (never FastAPI's 422), streams declare their media type, and operation ids are unique.
"""

from __future__ import annotations

import pytest

STREAMS = {"/v1/chat/completions": "text/event-stream", "/v1/completions": "text/event-stream",
           "/api/generate": "application/x-ndjson", "/api/chat": "application/x-ndjson",
           "/api/pull": "application/x-ndjson", "/api/push": "application/x-ndjson",
           "/api/create": "application/x-ndjson"}


@pytest.fixture(scope="module")
def schema(tmp_path_factory) -> dict:
    from gateway.app import create_app
    from core.settings import ServerSettings

    home = tmp_path_factory.mktemp("openapi-home")
    return create_app(ServerSettings.from_env({"INFER_HOME": str(home)})).openapi()


def _operations(schema: dict):
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            yield method.upper(), path, operation


def test_every_json_answer_has_a_schema(schema):
    empty = [f"{m} {p} {status}" for m, p, op in _operations(schema) for status, resp in op["responses"].items()
             if resp.get("content", {}).get("application/json", {}).get("schema", {"x": 1}) == {}]
    assert empty == []


def test_validation_errors_are_documented_as_400(schema):
    assert [f"{m} {p}" for m, p, op in _operations(schema) if "422" in op["responses"]] == []
    with_body = [(f"{m} {p}", op) for m, p, op in _operations(schema) if op.get("requestBody")]
    assert with_body and [name for name, op in with_body if "400" not in op["responses"]] == []
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_errors_have_each_api_shape(schema):
    paths = schema["paths"]
    openai = paths["/v1/chat/completions"]["post"]["responses"]["404"]["content"]["application/json"]["schema"]
    ollama = paths["/api/chat"]["post"]["responses"]["404"]["content"]["application/json"]["schema"]
    assert openai["$ref"].endswith("/OpenAIError") and ollama["$ref"].endswith("/OllamaError")
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert set(detail["required"]) == {"message", "type", "param", "code"}


def test_streams_declare_their_media_type(schema):
    for path, media in STREAMS.items():
        content = schema["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", media}, path
        assert "itemSchema" in content[media], path


def test_operation_ids_are_unique(schema):
    ids = [op["operationId"] for _, _, op in _operations(schema)]
    assert len(ids) == len(set(ids))

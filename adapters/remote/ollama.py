"""Another Ollama server (ollama.md §2): ``/api/chat`` and ``/api/generate`` as NDJSON.

Everything passes through in Ollama's own terms, with the entry's ``model`` (the backend's name, not the
public one): ``options`` minus our own keys (``engine``), ``keep_alive`` as seconds (a number; negative =
forever, 0 = unload), ``format``, ``tools``, and for prompts ``system``/``suffix``/``raw``/``template``.
Ollama has no ``tool_choice``: ``"none"`` sends no tools, a named function only that tool; ``"required"``
cannot be enforced there and is sent as plain tools. History tool calls go out with arguments as objects;
``message.tool_calls`` in a line come back as calls.
The final line (``done: true``) gives usage (``prompt_eval_count``/``eval_count``), the finish reason and
the backend's own timings (nanoseconds). Error bodies ``{"error"}``: 404 (model not found) names the backend
and its model, 400 passes through, 429/503 are overload; a mid-stream ``{"error"}`` line (status still 200)
is a backend failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import aclosing
from datetime import datetime
from typing import Any

from core.base import Chunk, EmbedResult, GenerationRequest, LoadedModel, Usage
from core.errors import (BackendError, BackendOverloaded, BackendProtocolError, BackendUnavailable,
                                  InvalidRequest)
from .http_errors import error_from_status
from .base import RemoteBackend, Turn, error_message
from .registry import register_remote
from frontend.tools.wire import chosen_tools, from_wire_call, ollama_messages
from .wire import ndjson_objects

OUR_OPTIONS = frozenset({"engine"})
NS = 1e9


class OllamaBackend(RemoteBackend):
    type = "ollama"
    health_path = "/"
    supports_embeddings = True

    async def generate(self, request: GenerationRequest, turn: Turn):
        path = "/api/chat" if request.is_chat else "/api/generate"
        done = False
        async with (self.post_stream(path, self.request_body(request), accept="application/x-ndjson") as response,
                    aclosing(ndjson_objects(response)) as lines):
            async for line in lines:
                if "error" in line:
                    raise self.line_error(line["error"])
                message = line.get("message") or {}
                text = message.get("content") if request.is_chat else line.get("response")
                thinking = message.get("thinking") if request.is_chat else line.get("thinking")
                calls = [from_wire_call(c) for c in message.get("tool_calls") or [] if isinstance(c, dict)]
                if text or calls or thinking:
                    yield Chunk(str(text or ""), tool_calls=calls, thinking=str(thinking or ""))
                if line.get("done"):
                    done = True
                    record(turn, line)
        if not done:
            raise BackendProtocolError(f"{self.where} ended the stream before its done line (incomplete stream)")

    def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.settings.model, "stream": request.stream}
        if request.is_chat:
            body["messages"] = ollama_messages(request.messages or [])
        else:
            body["prompt"] = request.prompt or ""
            body.update({k: v for k, v in (("system", request.system), ("suffix", request.suffix),
                                           ("template", request.template)) if v})
            if request.raw:
                body["raw"] = True
        options = {k: v for k, v in request.options.items() if k not in OUR_OPTIONS}
        extras = {"options": options, "format": request.format, "tools": chosen_tools(request.tools, request.tool_choice)}
        body.update({k: v for k, v in extras.items() if v})
        if request.keep_alive is not None:
            body["keep_alive"] = _seconds(request.keep_alive)
        if request.think is not None:
            body["think"] = request.think
        return body

    # -- errors ----------------------------------------------------------------------------------

    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> BackendError:
        message = error_message(body)
        if status == 404:
            return BackendUnavailable(f"{self.where} does not have model '{self.settings.model}' ({message}); "
                                      "pull it there or fix the entry's model")
        if status == 400:
            return InvalidRequest(message)
        if status in (429, 503):
            return BackendOverloaded(f"{self.where} is overloaded: {message}",
                                     retry_after=_retry_after(headers) or 1.0)
        return error_from_status(self.where, status, message, headers)

    def line_error(self, error: Any) -> BackendError:
        """An ``{"error"}`` line inside a 200 stream: the backend failed mid-generation."""
        return BackendUnavailable(f"{self.where} failed: {error}")

    # -- models ----------------------------------------------------------------------------------

    async def models(self) -> list[str]:
        body = await self.get_json("/api/tags")
        return [str(m.get("name")) for m in body.get("models", []) if isinstance(m, dict)]

    def lists(self, ids: list[str]) -> bool:
        """``tiny`` is listed as ``tiny:latest``: names compare with Ollama's default tag."""
        return _full_name(self.settings.model) in {_full_name(i) for i in ids}

    async def loaded_models(self) -> list[LoadedModel]:
        body = await self.get_json("/api/ps")
        wanted = _full_name(self.settings.model)
        for entry in body.get("models", []) if isinstance(body, dict) else []:
            if isinstance(entry, dict) and wanted in (_full_name(entry.get("name")), _full_name(entry.get("model"))):
                context = entry.get("context_length") or self.settings.context_length or 0
                return [LoadedModel(name=self.settings.name, backend=self.type, size=int(entry.get("size") or 0),
                                    digest=str(entry.get("digest") or ""), expires_at=_epoch(entry.get("expires_at")),
                                    context_length=int(context))]
        return []

    async def unload(self, model: str) -> bool:
        await self.post_json("/api/generate", {"model": self.settings.model, "keep_alive": 0, "stream": False})
        return True

    async def embed(self, model: str, inputs: list[str], *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult:
        if inputs and not isinstance(inputs[0], str):
            raise InvalidRequest("the ollama backend embeds text, not token ids; send the input as text", param="input")
        body: dict[str, Any] = {"model": self.settings.model, "input": inputs, "truncate": truncate}
        if keep_alive is not None:
            body["keep_alive"] = _seconds(keep_alive)
        reply = await self.post_json("/api/embed", body)
        if not isinstance(reply, dict) or not isinstance(reply.get("embeddings"), list):
            raise BackendProtocolError(f"{self.where} sent an /api/embed reply without embeddings")
        return EmbedResult(embeddings=reply["embeddings"], input_tokens=int(reply.get("prompt_eval_count") or 0),
                           load=(reply.get("load_duration") or 0) / NS, total=(reply.get("total_duration") or 0) / NS)


def record(turn: Turn, line: dict[str, Any]) -> None:
    """The done line: usage, finish reason, the backend's prompt/eval times (absent keys are zero)."""
    turn.reported = Usage(input_tokens=int(line.get("prompt_eval_count") or 0),
                          output_tokens=int(line.get("eval_count") or 0), source="backend")
    turn.finish_reason = "length" if line.get("done_reason") == "length" else "stop"
    if "prompt_eval_duration" in line:
        turn.prompt_eval = line["prompt_eval_duration"] / NS
    if "eval_duration" in line:
        turn.eval = line["eval_duration"] / NS


def _seconds(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def _full_name(name: Any) -> str:
    """``llama3`` and ``llama3:latest`` are the same model."""
    name = str(name or "")
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _epoch(stamp: Any) -> float | None:
    """RFC3339(Nano) -> epoch seconds (Python keeps microseconds)."""
    try:
        return datetime.fromisoformat(str(stamp)).timestamp() if stamp else None
    except ValueError:
        return None


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    try:
        return float(headers["retry-after"]) if headers is not None and "retry-after" in headers else None
    except ValueError:
        return None


register_remote("ollama", OllamaBackend)

"""OpenAI-compatible servers (type ``openai``: SGLang, LM Studio, hosted APIs), and the base of the
vLLM, TensorRT-LLM (``trtllm-serve``) and llama.cpp server adapters.

Chats go to ``/v1/chat/completions``, prompts to ``/v1/completions``, always as a stream with
``stream_options.include_usage`` so usage arrives in the final chunk, unless the client itself asked
for one reply (then one non-streamed call, whose usage the server always reports). Usage is read
from whichever chunk carries it, also one with non-empty ``choices``. Request options use Ollama's
names inside the gateway; ``SAMPLING`` maps the standard ones and each subclass adds the extensions
its server accepts (``EXTENSIONS``): an OpenAI endpoint gets only OpenAI fields, TensorRT-LLM rejects
unknown ones. The client's fields the gateway does not know (``request.extra``: vLLM's ``top_k``,
``echo``, ``prompt_logprobs``, ...) go on as sent where ``passes_fields``; the reply's ``logprobs`` (both
shapes, ``adapters/remote/logprobs.py``), ``stop_reason`` and other choice fields come back.
An Ollama /api/generate prompt without ``raw`` (``request.templated``) goes to the chat route, so the
server's chat template applies. Error events inside a 200 stream (``data: {"error": {...}}``) and error
replies become the mapped error with the server's ``param`` and ``code``.

Tools: ``tools``, ``tool_choice`` and the history's tool calls/results go out in OpenAI's form
(``frontend/tools/wire.py``); the reply's ``tool_calls`` come back as whole calls — a stream's deltas
(``delta.tool_calls[i]`` with the name first, then argument pieces) are joined by index and the calls
are emitted when the choice finishes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, ClassVar

import orjson

from core.base import Chunk, EmbedResult, GenerationRequest, ToolCall, Usage
from core.errors import BackendError, BackendProtocolError, InvalidRequest, ModelNotFound
from .http_errors import error_from_status
from .base import RemoteBackend, Turn, error_fields, error_message, message_of
from .logprobs import wire_logprobs
from .registry import register_remote
from frontend.tools.wire import from_wire_call, openai_messages
from .wire import parse_object, sse_batches

# Ollama option -> OpenAI field, for fields every OpenAI-compatible server takes.
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty", "stop": "stop"}


class OpenAICompatBackend(RemoteBackend):
    type: ClassVar[str] = "openai"
    health_path: ClassVar[str] = "/v1/models"
    EXTENSIONS: ClassVar[dict[str, str]] = {}  # server-specific sampling fields
    supports_embeddings = True
    takes_token_ids = True
    passes_fields = True  # the client's fields the gateway does not know go to the server (request.extra)
    continuous_usage = False  # stream_options.continuous_usage_stats (vLLM): usage on every chunk

    # -- request ----------------------------------------------------------------------------------

    def body(self, request: GenerationRequest, stream: bool) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self.settings.model, "stream": stream}
        chat = request.is_chat or as_chat(request)
        if chat:
            path = "/v1/chat/completions"
            body["messages"] = openai_messages(request.messages) if request.messages is not None else \
                generate_messages(request)
            self._chat_fields(request, body)
        else:
            path = "/v1/completions"
            if request.prompt_tokens is not None:  # token ids pass through, as vLLM takes them
                body["prompt"] = request.prompt_tokens
            else:
                body["prompt"] = (request.system + "\n\n" if request.system else "") + (request.prompt or "")
            if request.suffix:
                body["suffix"] = request.suffix
            if request.logprobs:
                body["logprobs"] = request.top_logprobs
        if stream:
            body["stream_options"] = {"include_usage": True}
            if request.early_usage and self.continuous_usage:
                body["stream_options"]["continuous_usage_stats"] = True
        body.update(self.sampling(request.options))
        if request.format is not None:
            body["response_format"] = response_format(request.format)
        if request.think is not None and chat:
            body.update(self.think_fields(request.think))
        if self.passes_fields:
            body.update(request.extra)
        if request.disagg_fields:
            body.update(request.disagg_fields)
        return path, body

    @staticmethod
    def _chat_fields(request: GenerationRequest, body: dict[str, Any]) -> None:
        if request.tools:
            body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
        if request.tools and not request.parallel_tool_calls:
            body["parallel_tool_calls"] = False
        if request.logprobs:
            body["logprobs"] = True
            if request.top_logprobs:
                body["top_logprobs"] = request.top_logprobs

    def think_fields(self, think: bool | str) -> dict[str, Any]:
        """A request's ``think`` as this server's fields: OpenAI's ``reasoning_effort`` for a level."""
        return {"reasoning_effort": think} if isinstance(think, str) else {}

    def sampling(self, options: dict[str, Any]) -> dict[str, Any]:
        out = {field: options[opt] for opt, field in {**SAMPLING, **self.EXTENSIONS}.items()
               if options.get(opt) is not None}
        if (options.get("num_predict") or -1) > 0:
            out["max_tokens"] = options["num_predict"]
        if options.get("seed") is not None and options["seed"] >= 0:
            out["seed"] = options["seed"]
        if out.get("stop") == []:
            del out["stop"]
        return out

    # -- response ---------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest, turn: Turn) -> AsyncIterator[Chunk]:
        stream = request.stream or request.timed  # per-token timings need the tokens as they come
        path, body = self.body(request, stream)
        if not stream:
            reply = await self.post_json(path, body, request.request_id)
            text = self.read_event(reply, turn, delta=False)
            thinking, logprobs = turn.take_thinking(), turn.take_logprobs()
            calls = [from_wire_call(c) for c in _message_calls(reply)]
            if text or calls or thinking or logprobs:
                yield Chunk(text=text, tool_calls=calls, thinking=thinking, logprobs=logprobs)
            return
        deltas, early = CallDeltas(), request.early_usage
        async with self.post_stream(path, body, request_id=request.request_id) as response, \
                aclosing(sse_batches(response)) as batches:
            async for batch in batches:
                for data in batch:
                    if data.strip() == "[DONE]":
                        if deltas:
                            yield Chunk("", tool_calls=deltas.take(), input_tokens=_early(early, turn))
                        return
                    event = parse_object(data)
                    text = self.read_event(event, turn, delta=True)
                    thinking, logprobs = turn.take_thinking(), turn.take_logprobs()
                    if text or thinking or logprobs:
                        reported = _early(early, turn)
                        early = early and reported is None
                        yield Chunk(text=text, thinking=thinking, logprobs=logprobs, input_tokens=reported)
                    if deltas.add(event):  # a forced call's first chunk says the prompt's size too
                        reported = _early(early, turn)
                        early = early and reported is None
                        yield Chunk("", tool_calls=deltas.take(), input_tokens=reported)
        raise BackendProtocolError(f"{self.where} ended the stream without data: [DONE]")

    def read_event(self, event: dict[str, Any], turn: Turn, *, delta: bool) -> str:
        """Text of one chunk (or of a whole reply); records usage, logprobs, the finish reason and the
        choice's other fields on ``turn``."""
        if "error" in event:
            raise self.stream_error(event["error"])
        if isinstance(event.get("usage"), dict):
            turn.reported = usage_of(event["usage"])
        text = ""
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if delta and "delta" in choice:
                text += self._message_text(choice.get("delta"), turn)
            elif "message" in choice:
                text += self._message_text(choice.get("message"), turn)
            else:
                text += choice.get("text") or ""
            if choice.get("logprobs"):
                turn.new_logprobs = (turn.new_logprobs or []) + wire_logprobs(choice["logprobs"])
            read_finish(choice, turn)
        return text

    @staticmethod
    def _message_text(message: Any, turn: Turn) -> str:
        """A delta's or message's content; its reasoning (vLLM's ``reasoning_content``, newer ``reasoning``)
        goes to ``turn.new_thinking``."""
        if not isinstance(message, dict):
            return ""
        thinking = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(thinking, str) and thinking:
            turn.new_thinking += thinking
        return message.get("content") or ""

    def stream_error(self, error: Any) -> Exception:
        """An error event inside a 200 stream (vLLM: ``{"error": {message, type, param, code}}``)."""
        status, fields = 500, {}
        if isinstance(error, dict):
            code = error.get("code", error.get("http_status_code"))
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            fields = {k: error[k] for k in ("param", "code") if isinstance(error.get(k), (str, int))}
        return error_from_status(self.where, status, message_of({"error": error}) or "error event in the stream",
                                 **fields)

    def error_from_response(self, status: int, body: bytes, headers: Any) -> BackendError:
        """A 404 whose body is an OpenAI error object came from the server itself, about the model (vLLM:
        "The model does not support Embeddings API"): 404 naming the entry's model, not a bad base_url."""
        if status == 404 and error_fields(body).get("code") in (404, "404", "model_not_found"):
            return ModelNotFound(self.settings.name, f"model '{self.settings.name}': {self.where} answered 404: "
                                                     f"{error_message(body)}")
        return super().error_from_response(status, body, headers)

    # -- other routes -----------------------------------------------------------------------------

    async def embed(self, model: str, inputs: list[str], *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult:
        t0 = time.perf_counter()
        try:
            reply = await self.post_json("/v1/embeddings", {"model": self.settings.model, "input": inputs})
        except BackendError as exc:
            if exc.backend_status == 404:  # vLLM serves /v1/embeddings only for an embedding model
                raise ModelNotFound(self.settings.name, f"model '{self.settings.name}' does not serve embeddings: "
                                                        f"{self.where} answered 404 on /v1/embeddings") from exc
            raise
        rows = sorted(reply.get("data") or [], key=lambda d: d.get("index", 0))
        vectors = [row.get("embedding") for row in rows]
        if len(vectors) != len(inputs) or not all(isinstance(v, list) for v in vectors):
            raise BackendProtocolError(f"{self.where} answered /v1/embeddings without one vector per input")
        tokens = (reply.get("usage") or {}).get("prompt_tokens") or sum(
            self.counter.count(t) if isinstance(t, str) else len(t) for t in inputs)
        return EmbedResult(vectors, int(tokens), total=time.perf_counter() - t0)


class CallDeltas:
    """A stream's ``delta.tool_calls`` pieces of choice 0, joined by index until the choice finishes."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, str]] = {}

    def __bool__(self) -> bool:
        return bool(self.calls)

    def add(self, event: dict[str, Any]) -> bool:
        """Take in one event; True when the choice finished (its calls are complete)."""
        finished = False
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            for piece in (choice.get("delta") or {}).get("tool_calls") or []:
                self._add(piece)
            finished = finished or bool(choice.get("finish_reason"))
        return finished and bool(self.calls)

    def _add(self, piece: dict[str, Any]) -> None:
        call = self.calls.setdefault(int(piece.get("index", len(self.calls))), {"id": "", "name": "", "arguments": ""})
        function = piece.get("function") or {}
        call["id"] = piece.get("id") or call["id"]
        call["name"] += function.get("name") or ""
        arguments = function.get("arguments")
        call["arguments"] += arguments if isinstance(arguments, str) else _json_text(arguments)

    def take(self) -> list[ToolCall]:
        calls = [from_wire_call({"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"] or "{}"}})
                 for _, c in sorted(self.calls.items())]
        self.calls = {}
        return calls


def _message_calls(reply: Any) -> list[dict[str, Any]]:
    for choice in (reply.get("choices") or []) if isinstance(reply, dict) else []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return [c for c in (choice.get("message") or {}).get("tool_calls") or [] if isinstance(c, dict)]
    return []


def _json_text(value: Any) -> str:
    return "" if value is None else orjson.dumps(value).decode()


CHOICE_FIELDS = frozenset({"index", "text", "message", "delta", "logprobs", "finish_reason", "stop_reason"})


def read_finish(choice: dict[str, Any], turn: Turn) -> None:
    """The finish reason, vLLM's ``stop_reason`` (the stop string that matched) and the choice's fields
    the gateway does not build (kept for ``Done.choice_fields``, as the server sent them)."""
    if choice.get("finish_reason"):
        turn.finish_reason = "length" if choice["finish_reason"] == "length" else "stop"
        if isinstance(choice.get("stop_reason"), str):
            turn.stop_sequence = choice["stop_reason"]
    for key, value in choice.items():
        if value is not None and key not in CHOICE_FIELDS:
            turn.choice_fields[key] = value


def as_chat(request: GenerationRequest) -> bool:
    """An Ollama /api/generate prompt the model's chat template should wrap, for a server that applies
    its own template only on its chat route (a ``template`` override or a ``suffix`` keeps the prompt raw)."""
    return (request.templated and not request.raw and request.prompt_tokens is None and not request.suffix
            and request.template is None)


def generate_messages(request: GenerationRequest) -> list[dict[str, Any]]:
    """The /api/generate prompt as a chat: ``system`` as the system message, the prompt as the user's."""
    head = [{"role": "system", "content": request.system}] if request.system else []
    return [*head, {"role": "user", "content": request.prompt or ""}]


def _early(early: bool, turn: Turn) -> int | None:
    """The prompt's size for a stream's first chunk, when the request wants it early and the backend
    said it (vLLM's ``continuous_usage_stats``)."""
    return turn.reported.input_tokens if early and turn.reported else None


def usage_of(usage: dict[str, Any]) -> Usage:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    return Usage(input_tokens=int(usage.get("prompt_tokens") or 0),
                 output_tokens=int(usage.get("completion_tokens") or 0),
                 cached_input_tokens=int(cached) if cached is not None else None, source="backend",
                 reasoning_tokens=int(reasoning) if reasoning else None)


def response_format(fmt: str | dict) -> dict[str, Any]:
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    raise InvalidRequest(f"unsupported format {fmt!r}: use \"json\" or a JSON schema", param="format")


register_remote("openai", OpenAICompatBackend)

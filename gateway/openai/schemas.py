"""OpenAI request bodies (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``) and their
mapping onto :class:`core.base.GenerationRequest`.

Field names mirror the wire exactly. Unknown fields are ignored (clients send extras such as
``user`` or vLLM's ``top_k``); a known field with the wrong type is a 400 (models are
strict: ``"temperature": "0.5"`` is refused, not coerced). Absent sampling fields stay absent, so
the model's own parameters apply (unlike Ollama, which forces ``temperature``/``top_p`` to 1.0).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.base import GenerationRequest
from frontend.tools.wire import check_tools, internal_calls, name_tool_results

from gateway.http.bodies import checked_text
from gateway.http.errors import APIError

T = TypeVar("T", bound=BaseModel)
SEED_MASK = 0x7FFFFFFF  # llama.cpp seeds are uint32 and 0xFFFFFFFF means "random"
MAX_N = 8


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class ContentPart(_Wire):
    type: str
    text: str | None = None


class FunctionCall(_Wire):
    name: str
    arguments: str


class ToolCallIn(_Wire):
    """An assistant message's call in the history (``arguments`` is JSON text, as OpenAI sends it)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Wire):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Wire):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Wire):
    name: str


class NamedToolChoice(_Wire):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Wire):
    include_usage: bool | None = False


class JSONSchemaSpec(_Wire):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class ResponseFormat(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaSpec | None = None


class _Request(_Wire):
    """A whole request body: its text is checked once, before field validation."""

    _text = model_validator(mode="before")(classmethod(checked_text))


class _Sampling(_Request):
    """Fields shared by chat and legacy completions. Fields not declared here (vLLM's ``top_k``, ``min_p``,
    ``repetition_penalty``, ``prompt_logprobs``, a client's ``user``) are kept as given for the backends
    that take them (``GenerationRequest.extra``)."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = Field(default=None, description="a string or a list of up to 4 strings")
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    ignore_eos: bool | None = None  # vLLM's extension, accepted as an extra body field
    speculative: bool | str | None = None  # speculative decoding on/off for this request (native engine)
    engine: str | None = None  # which in-process engine serves the request (llamacpp, native)
    n: int | None = Field(default=1, ge=1, le=MAX_N)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # vLLM's P/D field (routing/disagg.py): a prefill or decode leg for the native engine (kv_transfer.py)
    kv_transfer_params: dict[str, Any] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        return check_stop(value)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def check(self) -> None:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > 4:
            raise APIError(400, "'stop' accepts at most 4 sequences", param="stop")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")

    def passed_fields(self) -> dict[str, Any]:
        """The body's fields the gateway does not act on, for a backend that takes them."""
        return dict(self.model_extra or {})

    @property
    def disagg_fields(self) -> dict[str, Any] | None:
        return {"kv_transfer_params": self.kv_transfer_params} if self.kv_transfer_params else None

    def options(self, num_predict: int | None, index: int) -> dict[str, Any]:
        """Ollama option overrides for generation ``index`` (seed + index when a seed is given)."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        seed = None if self.seed is None else (self.seed + index) & SEED_MASK
        values = {"num_predict": num_predict, "temperature": self.temperature, "top_p": self.top_p,
                  "seed": seed, "stop": stops, "frequency_penalty": self.frequency_penalty,
                  "presence_penalty": self.presence_penalty, "ignore_eos": self.ignore_eos,
                  "speculative": self.speculative}
        return {k: v for k, v in values.items() if v is not None}


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: one call at most (enforced where the output is forced)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None  # a thinking model's think

    def check(self) -> None:
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "'top_logprobs' requires 'logprobs': true", param="top_logprobs")

    def generation_requests(self, client: str | None) -> list[GenerationRequest]:
        self.check()
        messages = name_tool_results([_message(i, m) for i, m in enumerate(self.messages)])
        fmt = _format(self.response_format)
        num_predict = self.max_completion_tokens or self.max_tokens
        tools, choice = self._tools()
        return [GenerationRequest(model=self.model, messages=messages, options=self.options(num_predict, i),
                                  think=think_of_effort(self.reasoning_effort),
                                  engine=self.engine, format=fmt, logprobs=bool(self.logprobs), top_logprobs=self.top_logprobs or 0,
                                  strict_max_tokens=True, client=client, tools=tools, tool_choice=choice,
                                  parallel_tool_calls=self.parallel_tool_calls is not False,
                                  extra=self.passed_fields(), disagg_fields=self.disagg_fields)
                for i in range(self.n or 1)]

    def _tools(self) -> tuple[list[dict] | None, str | dict | None]:
        tools = [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None
        choice = self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedToolChoice) else self.tool_choice
        check_tools(tools, choice)
        return tools, choice


class CompletionRequest(_Sampling):
    prompt: str | list[Any]
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False

    def prompts(self) -> list[str | list[int]]:
        """The prompts: texts, or token-id lists (``[1, 2]`` is one prompt, ``[[1, 2], [3]]`` two)."""
        prompts = texts_or_tokens(self.prompt, "prompt")
        if not prompts:
            raise APIError(400, "'prompt' must not be empty", param="prompt")
        return prompts

    def generation_requests(self, client: str | None) -> list[tuple[int, GenerationRequest]]:
        """(prompt index, request) per choice: every prompt ``n`` times."""
        self.check()
        n = self.n or 1
        extra = {**self.passed_fields(), **({"echo": True} if self.echo else {})}
        return [(p, GenerationRequest(model=self.model, prompt=text if isinstance(text, str) else "",
                                      prompt_tokens=None if isinstance(text, str) else text, suffix=self.suffix,
                                      options=self.options(self.max_tokens, i), engine=self.engine,
                                      logprobs=self.logprobs is not None,
                                      top_logprobs=self.logprobs or 0, strict_max_tokens=True, client=client,
                                      extra=extra, disagg_fields=self.disagg_fields))
                for p, text in enumerate(self.prompts()) for i in range(n)]

    def check_echo(self, backend: Any) -> None:
        """``echo`` needs a server that returns the prompt itself (an OpenAI-compatible remote)."""
        if self.echo and not getattr(backend, "passes_fields", False):
            raise APIError(400, "'echo' is not supported by this model's backend (an OpenAI-compatible remote "
                                "such as vLLM supports it)", param="echo")


class EmbeddingRequest(_Request):
    model: str = Field(min_length=1)
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = Field(default=None, ge=1)

    def inputs(self) -> list[str] | list[list[int]]:
        """Texts, or token-id lists as vLLM and OpenAI take them (``[1, 2]`` is one input)."""
        items = texts_or_tokens(self.input, "input")
        if not items:
            raise APIError(400, "'input' must not be empty", param="input")
        if any(not i for i in items):
            raise APIError(400, "'input' must not contain empty strings or token lists", param="input")
        if len({isinstance(i, str) for i in items}) > 1:
            raise APIError(400, "'input' mixes texts and token lists: send one kind", param="input")
        return items


def check_stop(value: Any) -> Any:
    """``stop`` as OpenAI takes it: a string or a list of strings (the count is checked later)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ValueError(f"must be a string or a list of up to 4 strings, got {type(value).__name__} {value!r:.40}")


def think_of_effort(effort: str | None) -> bool | str | None:
    """OpenAI's ``reasoning_effort`` as a request's ``think``, as Ollama maps it ("minimal" thinks "low")."""
    if effort is None:
        return None
    return False if effort == "none" else ("low" if effort == "minimal" else effort)


def texts_or_tokens(value: str | list[Any], param: str) -> list[Any]:
    """OpenAI's four shapes of a prompt or input: a text, texts, one token list, token lists."""
    if isinstance(value, str):
        return [value]
    if value and all(_is_token(t) for t in value):
        return [list(value)]
    for item in value:
        if not isinstance(item, str) and not (isinstance(item, list) and all(_is_token(t) for t in item)):
            raise APIError(400, f"'{param}' must be a string, a list of strings, a list of token ids (integers "
                                ">= 0) or a list of such lists", param=param)
    return list(value)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _message(index: int, message: Message) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": _content(index, message.content)}
    if message.tool_calls and role == "assistant":
        calls = [c.model_dump() for c in message.tool_calls]
        out["tool_calls"] = internal_calls(calls, f"messages[{index}].tool_calls")
    if role == "tool" and message.tool_call_id:  # lenient like Ollama: a result without its id still reads
        out["tool_call_id"] = message.tool_call_id
    return out


def _content(index: int, content: str | list[ContentPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.type == "text":
            texts.append(part.text or "")
        elif part.type in ("image_url", "input_image", "image"):
            raise APIError(400, "images are not supported by this model", param=f"messages.{index}.content")
        else:
            raise APIError(400, f"unsupported content part type '{part.type}'", param=f"messages.{index}.content")
    return "\n".join(texts)


def _format(response_format: ResponseFormat | None) -> str | dict | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return "json"
    spec = response_format.json_schema
    if spec is None or spec.schema_ is None:
        raise APIError(400, "'response_format.json_schema.schema' is required for type 'json_schema'",
                       param="response_format")
    return spec.schema_

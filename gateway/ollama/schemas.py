"""Request bodies of the Ollama API (``/api/*``), with Ollama's wire names.

Unknown fields are ignored (clients send extras such as ``context`` or ``shift``); a field of the
wrong type is a 400. ``name`` is accepted as an alias of ``model`` where Ollama accepts it.
Response bodies are built in :mod:`gateway.ollama.views`.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from core.durations import parse_keep_alive
from frontend.reasoning import LEVELS
from frontend.tools.wire import check_tools, internal_calls, name_tool_results
from gateway.http.bodies import checked_text
from gateway.http.errors import APIError

__all__ = ["ChatMessage", "ChatRequest", "CopyRequest", "CreateRequest", "EmbedRequest", "EmbeddingsRequest",
           "GenerateRequest", "ModelRequest", "PullRequest", "ShowRequest", "keep_alive_seconds"]

KeepAlive = str | float | None
_MODEL = Field(min_length=1, validation_alias=AliasChoices("model", "name"))


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    _text = model_validator(mode="before")(classmethod(checked_text))


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a duration such as \"5m\" or a number of seconds")
    return value


class _Generation(_Body):
    """Fields /api/generate and /api/chat share."""

    model: str = Field(min_length=1)
    stream: StrictBool | None = None
    format: str | dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    options: dict[str, Any] | None = None
    think: bool | str | None = None  # true/false, or a level: "low", "medium", "high"
    truncate: StrictBool | None = None
    logprobs: StrictBool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)

    _keep_alive = field_validator("keep_alive", mode="before")(_no_bool)

    @field_validator("think")
    @classmethod
    def _think(cls, value: bool | str | None) -> bool | str | None:
        if isinstance(value, str) and value not in LEVELS:
            raise ValueError('use true, false, "low", "medium" or "high"')
        return value

    @field_validator("format")
    @classmethod
    def _format(cls, value: str | dict | None) -> str | dict | None:
        if value == "":
            return None
        if isinstance(value, str) and value != "json":
            raise ValueError("use \"json\" or a JSON schema object")
        return value

    @field_validator("options", mode="before")
    @classmethod
    def _options(cls, value: Any) -> Any:
        return {} if value is None else value

    @property
    def streaming(self) -> bool:
        return self.stream is not False

    @property
    def engine(self) -> str | None:
        """``options.engine`` picks the in-process engine (a routing choice, not a sampling option)."""
        value = (self.options or {}).get("engine")
        return None if value is None else str(value)

    @property
    def sampling_options(self) -> dict[str, Any]:
        return {k: v for k, v in (self.options or {}).items() if k != "engine"}


class GenerateRequest(_Generation):
    prompt: str | None = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None  # deprecated; ignored
    raw: StrictBool = False
    images: list[str] | None = None


class ChatMessage(_Body):
    role: str
    content: str | None = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()

    def for_backend(self, index: int = 0) -> dict[str, Any]:
        out = self.model_dump(exclude_none=True, exclude={"images"})
        out["content"] = self.content or ""
        if self.tool_calls:
            out["tool_calls"] = internal_calls(self.tool_calls, f"messages[{index}].tool_calls")
        return out


class ChatRequest(_Generation):
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None

    def backend_messages(self) -> list[dict[str, Any]]:
        """The messages in the internal shape (``frontend/tools/wire.py``); the tools checked (400 when malformed)."""
        check_tools(self.tools, None)
        return name_tool_results([m.for_backend(i) for i, m in enumerate(self.messages or [])])


class EmbedRequest(_Body):
    model: str = Field(min_length=1)
    input: str | list[str] | None = None  # "" or []: load the model (Ollama's empty request); absent: 400
    truncate: StrictBool = True
    dimensions: int | None = Field(default=None, ge=0)
    keep_alive: KeepAlive = None
    options: dict[str, Any] | None = None

    _keep_alive = field_validator("keep_alive", mode="before")(_no_bool)


class EmbeddingsRequest(_Body):
    """Legacy ``/api/embeddings``: one prompt, one vector."""

    model: str = Field(min_length=1)
    prompt: str = ""
    keep_alive: KeepAlive = None
    options: dict[str, Any] | None = None

    _keep_alive = field_validator("keep_alive", mode="before")(_no_bool)


class ModelRequest(_Body):
    """Bodies that only name a model: /api/delete."""

    model: str = _MODEL


class ShowRequest(ModelRequest):
    verbose: StrictBool = False


class PullRequest(ModelRequest):
    insecure: StrictBool = False
    stream: StrictBool | None = None


class CopyRequest(_Body):
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


class CreateMessage(_Body):
    role: str
    content: str = ""


class CreateRequest(ModelRequest):
    from_: str | None = Field(default=None, alias="from")
    files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    template: str | None = None
    system: str | None = None
    license: str | list[str] | None = None
    parameters: dict[str, Any] | None = None
    messages: list[CreateMessage] | None = None
    quantize: str | None = None
    stream: StrictBool | None = None


def keep_alive_seconds(value: KeepAlive) -> float | None:
    """Seconds from a ``keep_alive`` field (None = the server default); a bad or out-of-range value is a 400."""
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except ValueError as exc:
        raise APIError(400, f"invalid keep_alive: {exc}", param="keep_alive") from None

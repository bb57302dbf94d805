"""The runner protocol: typed messages between the gateway and a runner process.

One Unix socket pair per runner (``channel.py``); msgspec (MessagePack) encodes each message, one
tagged struct per message, so each side decodes into exactly these types and nothing else (vLLM v1
sends msgspec structs between its API server and ``EngineCore`` the same way, over ZeroMQ).

gateway -> runner                        runner -> gateway
    Load(engine, store, model, ...)          Ready(pid, context_length) | Failed(error)
    Generate(id, request, admit, resolved)   [Admit(id, prompt_tokens, context, served_by)]
                                             Token(id, chunk)... then Finished(id, done, load, spec_decode)
                                             | Failed(id, error); a native runner sends each engine
                                             step's Tokens and Finisheds as one Outputs(tokens, finished, load)
    Admitted(id, cap) | Refused(id)          (the answer to Admit: generation goes on, or fails)
    Embed(id, model, inputs, ...)            Embedded(id, result) | Failed(id, error)
    Cancel(id)                               (the stream ends with a ``cancelled`` Finished)
    Ping(id)                                 Pong(id, load)
    Shutdown()                               the process exits 0

``Generate.request`` is a :class:`~core.base.GenerationRequest` without its cancel token,
its caller and its admission hook, and with ``keep_alive`` -1 (the gateway's scheduler stops the runner); events carry the ``Chunk`` and ``Done`` dataclasses as they are.
A native runner's ``Generate`` carries the prompt as token ids (``prompt_tokens``), counted and admitted
by the gateway before it is sent, and what the gateway resolved for it (``Resolved``: the effective options,
the weights, the adapter), so the runner reads neither the store nor the model's parameters per request. A keyed request to a runner that renders its own prompt (llama.cpp,
scripted: ``Generate.admit``) is admitted by the gateway (``request.admit``: the key's budget and
limits) once the runner has counted its prompt: the runner sends ``Admit`` and generates nothing
until the answer (``Admitted`` with the most tokens it may generate, or ``Refused``; the gateway
then answers the client with its own error). A runner's error
travels as its class name in ``core.errors`` and its fields (:func:`error_to_wire`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from core import errors
from core.base import Chunk, Done, EmbedResult, GenerationRequest

_LOCAL_ONLY = ("cancel", "caller", "admit")  # fields of a request that stay in the gateway


class WireError(msgspec.Struct):
    type: str
    message: str
    param: str | None = None
    partial: Done | None = None
    retry_after: float | None = None
    extra: dict[str, Any] = {}


# -- gateway -> runner ------------------------------------------------------------------------------

class Load(msgspec.Struct, tag=True):
    """Load ``model`` of the store at ``store`` with ``options`` (Ollama's) and the server's settings."""

    engine: str
    store: str
    model: str
    options: dict[str, Any] = {}
    settings: dict[str, Any] = {}


class Resolved(msgspec.Struct):
    """What the gateway resolved for a request from the store: its effective options (every field of
    ``core.options.Options``, the admission's cap in ``num_predict``), the digest of the weights it runs on
    (a model's ``base_digest``) and its LoRA adapter's file (None: none)."""

    options: dict[str, Any]
    weights: str
    adapter: str | None = None


class Generate(msgspec.Struct, tag=True):
    id: int
    request: dict[str, Any]
    admit: bool = False  # the gateway admits it once its prompt is counted (``Admit``)
    resolved: Resolved | None = None  # None: the runner resolves the request's model and options itself


class Admitted(msgspec.Struct, tag=True):
    id: int
    cap: int | None = None  # the most tokens it may generate (None: no bound)


class Refused(msgspec.Struct, tag=True):
    id: int


class Embed(msgspec.Struct, tag=True):
    id: int
    model: str
    inputs: list[Any]  # texts, or token-id lists
    truncate: bool = True


class Cancel(msgspec.Struct, tag=True):
    id: int


class Ping(msgspec.Struct, tag=True):
    id: int


class Shutdown(msgspec.Struct, tag=True):
    pass


# -- runner -> gateway ------------------------------------------------------------------------------

class Ready(msgspec.Struct, tag=True):
    pid: int
    context_length: int


class Admit(msgspec.Struct, tag=True):
    id: int
    prompt_tokens: int
    context: int | None = None
    served_by: str | None = None


class Token(msgspec.Struct, tag=True):
    id: int
    chunk: Chunk


class Finished(msgspec.Struct, tag=True):
    id: int
    done: Done
    load: dict[str, float] = {}  # the runner's load as the request ends (as in Pong)
    # the model's speculative decoding counters as the request ends ({model: counters}; vLLM's engine core
    # sends its scheduler stats with its outputs the same way): what /metrics shows between requests
    spec_decode: dict[str, dict[str, Any]] = {}


class Outputs(msgspec.Struct, tag=True):
    """One engine step's outputs, every request it advanced, in one message (vLLM's ``EngineCoreOutputs``):
    a request's ``Token`` (if the step gave it text) comes before its ``Finished``; ``load`` is the runner's
    load after the step (as in ``Pong``)."""

    tokens: list[Token] = []
    finished: list[Finished] = []
    load: dict[str, float] = {}


class Embedded(msgspec.Struct, tag=True):
    id: int
    result: EmbedResult


class Failed(msgspec.Struct, tag=True):
    id: int  # -1: the load failed
    error: WireError


class Pong(msgspec.Struct, tag=True):
    id: int
    load: dict[str, float] = {}


ToRunner = Load | Generate | Admitted | Refused | Embed | Cancel | Ping | Shutdown
FromRunner = Ready | Admit | Token | Finished | Outputs | Embedded | Failed | Pong

encoder = msgspec.msgpack.Encoder()
to_runner = msgspec.msgpack.Decoder(ToRunner)
from_runner = msgspec.msgpack.Decoder(FromRunner)


def request_to_wire(request: GenerationRequest) -> dict[str, Any]:
    """The request's fields for the runner; its ``keep_alive`` stays in the gateway, whose scheduler is the
    only keep-alive (``adapters/engines/scheduler.py``): the runner's engine keeps its model for good."""
    fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(request) if f.name not in _LOCAL_ONLY}
    return {**fields, "keep_alive": -1}


def request_from_wire(fields: dict[str, Any]) -> GenerationRequest:
    return GenerationRequest(**fields)


def error_to_wire(exc: errors.BackendError) -> WireError:
    extra = {k: v for k, v in vars(exc).items()
             if k not in ("message", "param", "partial", "retry_after") and isinstance(v, (int, float, str))}
    return WireError(type(exc).__name__, exc.message, exc.param, exc.partial, getattr(exc, "retry_after", None),
                     extra)


def error_from_wire(wire: WireError) -> errors.BackendError:
    """The runner's error as the same class of the error tree (BackendError for a name it does not know)."""
    cls = getattr(errors, wire.type, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.BackendError)):
        cls = errors.BackendError
    exc = cls.__new__(cls)
    errors.BackendError.__init__(exc, wire.message, param=wire.param, partial=wire.partial)
    if wire.retry_after is not None:
        exc.retry_after = wire.retry_after
    vars(exc).update(wire.extra)
    return exc

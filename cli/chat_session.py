"""``infer run``'s conversation with the local engines, in this process (``--local``, or no server answers).

The engines are ``infer serve``'s (``adapters/engines/runner/backend.py``: the same scheduler, keep-alive,
front end and runner code), each model's runner on a thread of this process instead of a process of its own.

Each turn is one chat request through :class:`gateway.serving.recorder.Recorder` (route ``run``, source
``cli``), so it writes exactly one usage-ledger row (through the ledger's writer thread), like a
request to ``infer serve`` would. The
reply streams to stdout as it is generated; ``--verbose`` statistics go to stderr in Ollama's format.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, TextIO

from sqlalchemy.exc import SQLAlchemyError

from core.base import Chunk, Done, GenerationRequest
from core.errors import BackendError
from adapters.engines.runner.backend import in_process_engines
from core.options import Options, check_parameters, resolve_options
from core.settings import LocalSettings, SettingsError
from ledger.db import open_db
from core.durations import format_duration
from gateway.serving.recorder import Recorder
from ledger.writer import LedgerWriter
from registry.create import create_model
from registry.details import ModelDetails
from registry.errors import ModelfileError
from registry.modelfile import Modelfile
from registry.names import parse_name
from registry.store import Store


def local_settings_from_env(engine: str | None = None) -> LocalSettings:
    """The engine settings ``infer serve`` would use (``INFER_*``), with ``--engine`` on top."""
    try:
        return LocalSettings.from_env(engine=engine)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


class ChatSession:
    """The state ``/set`` and ``/clear`` change, and the backend, recorder and ledger behind it."""

    def __init__(self, store: Store, model: str, *, db_url: str, settings: LocalSettings, verbose: bool = False,
                 format: str | dict | None = None, keep_alive: float | None = None,
                 out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.store, self.model = store, model
        self.verbose, self.format, self.keep_alive = verbose, format, keep_alive
        self.system: str | None = None
        self.messages: list[dict[str, Any]] = []
        self.options: dict[str, Any] = {}
        self.out, self.err = out or sys.stdout, err or sys.stderr
        try:
            self.db = open_db(db_url)
        except (ValueError, OSError, SQLAlchemyError) as exc:
            raise SettingsError(f"cannot open the usage database: {exc}") from None
        self.engines = in_process_engines(store, settings)
        self.backend = self.engines.get()
        self.ledger = LedgerWriter(self.db)
        self.recorder = Recorder(self.ledger, None)

    def details(self, model: str | None = None) -> ModelDetails:
        return self.backend.details(model or self.model)

    def request(self, *, truncate: bool) -> GenerationRequest:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.messages
        return GenerationRequest(model=self.model, messages=[dict(m) for m in messages],
                                 options=dict(self.options), format=self.format, truncate=truncate,
                                 keep_alive=self.keep_alive, source="cli")

    async def send(self, text: str, *, truncate: bool = True) -> Done | None:
        """One turn: stream the reply to ``out``; the user message and the reply join the history.

        A request error removes the user message again and propagates. When the turn is cancelled
        (Ctrl+C), what was generated so far stays in the history.
        """
        self.messages.append({"role": "user", "content": text})
        try:
            gen = await self.recorder.start(self.backend, self.request(truncate=truncate), route="run", stream=True)
        except BaseException:
            self.messages.pop()
            raise
        reply: list[str] = []
        try:
            async for event in gen:
                if isinstance(event, Chunk) and event.text:
                    reply.append(event.text)
                    self.out.write(event.text)
                    self.out.flush()
        finally:
            self.messages.append({"role": "assistant", "content": "".join(reply)})
        self.out.write("\n\n")
        self.out.flush()
        if self.verbose and gen.done is not None:
            self.err.write("".join(line + "\n" for line in stats_lines(gen.done)))
            self.err.flush()
        return gen.done

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until every turn so far has its ledger row written (a cancelled turn ends once the
        backend has stopped generating and reported what it generated)."""
        try:
            await asyncio.wait_for(self.recorder.settle(), timeout)
        except TimeoutError:
            pass
        await asyncio.to_thread(self.ledger.flush, timeout)

    async def aclose(self) -> None:
        await self.settle()
        await self.engines.aclose()
        self.ledger.close()
        self.db.dispose()

    def save(self, name: str) -> None:
        """``/save``: a new model from this one, the system message, parameters and history."""
        mf = Modelfile(from_=self.model, system=self.system, parameters=dict(self.options),
                       messages=list(self.messages))
        try:
            check_parameters(mf.parameters)
        except ValueError as exc:
            raise ModelfileError(str(exc)) from None
        create_model(self.store, parse_name(name), mf, self.store.root)

    def list_models(self) -> None:
        from .models import list_cmd

        list_cmd()


def stats_lines(done: Done) -> list[str]:
    """Ollama's ``--verbose`` summary (each line only when its value is > 0), plus TTFT and TPOT."""
    t, u = done.timings, done.usage
    rows: list[tuple[str, str, float]] = [
        ("total duration", format_duration(t.total), t.total),
        ("load duration", format_duration(t.load), t.load),
        ("prompt eval count", f"{u.input_tokens} token(s)", u.input_tokens),
    ]
    if t.prompt_eval > 0:
        rate = u.input_tokens / t.prompt_eval
        rows += [("prompt eval duration", format_duration(t.prompt_eval), t.prompt_eval),
                 ("prompt eval rate", f"{rate:.2f} tokens/s", rate)]
    rows.append(("eval count", f"{u.output_tokens} token(s)", u.output_tokens))
    if t.eval > 0:
        rate = u.output_tokens / t.eval
        rows += [("eval duration", format_duration(t.eval), t.eval), ("eval rate", f"{rate:.2f} tokens/s", rate)]
    if t.ttft is not None:
        rows.append(("time to first token", format_duration(t.ttft), t.ttft))
    tpot = t.tpot
    if tpot is not None and u.output_tokens > len(t.token_times) and t.eval > 0:  # chunks of several tokens
        tpot = t.eval / max(1, u.output_tokens - 1)  # (speculative decoding): per token, not per chunk
    if tpot is not None:
        rows.append(("time per output token", format_duration(tpot), tpot))
    if t.draft_tokens:
        rows += [("draft tokens", f"{t.draft_tokens} token(s)", t.draft_tokens),
                 ("draft acceptance", f"{t.accepted_tokens / t.draft_tokens:.1%} ({t.accepted_tokens} accepted)", 1)]
    return [f"{label + ':':<21} {text}" for label, text, value in rows if value > 0]


def parse_parameter(name: str, values: list[str]):
    """A typed option value from ``/set parameter`` words, checked like a request option."""
    field = Options.model_fields.get(name)
    if field is None:
        raise ValueError(f"unknown parameter '{name}'")
    kind = field.annotation
    raw = values[0]
    if name == "stop":
        value: object = list(values)
    elif kind is bool:
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"invalid bool value [{raw}]")
        value = raw.lower() == "true"
    else:
        try:
            value = int(raw) if kind is int else float(raw)
        except ValueError:
            raise ValueError(f"invalid {'int' if kind is int else 'float'} value [{raw}]") from None
    try:
        resolve_options({name: value})
    except BackendError as exc:
        raise ValueError(exc.message) from None
    return value

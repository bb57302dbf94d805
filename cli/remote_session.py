"""``infer run``'s conversation with a running server: each turn is one streamed ``POST /api/chat``.

The same interface as :class:`cli.chat_session.ChatSession` (the REPL drives either), the same
output: the reply streams to stdout, then a blank line; ``--verbose`` prints the statistics of the
server's final chunk in Ollama's format (time to first token and per output token measured here,
as the chunks arrive). The server keeps the model loaded for ``keep_alive`` and writes the ledger
row; ``/save`` is ``POST /api/create``, ``/list`` ``GET /api/tags`` and ``/show`` reads ``POST /api/show``,
as in Ollama's REPL.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

import typer

from core.base import Done, Timings, Usage
from core.errors import BackendError
from registry.details import ModelDetails
from registry.gguf_info import GGUFInfo
from registry.names import parse_name

from .chat_session import stats_lines
from .client import ServerClient
from .format import human_bytes, human_time_ago, parse_time, table


class RemoteChatSession:
    """The state ``/set`` and ``/clear`` change, and the server that answers each turn."""

    def __init__(self, client: ServerClient, model: str, *, verbose: bool = False,
                 format: str | dict | None = None, keep_alive: float | None = None, engine: str | None = None,
                 out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.client, self.model, self.engine = client, model, engine
        self.verbose, self.format, self.keep_alive = verbose, format, keep_alive
        self.system: str | None = None
        self.messages: list[dict[str, Any]] = []
        self.options: dict[str, Any] = {}
        self.out, self.err = out or sys.stdout, err or sys.stderr

    def details(self, model: str | None = None) -> ModelDetails:
        name = model or self.model
        return details_from_show(name, self.client.call("POST", "/api/show", {"model": name}))

    def body(self, *, truncate: bool) -> dict[str, Any]:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.messages
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True, "truncate": truncate}
        options = {**self.options, **({"engine": self.engine} if self.engine else {})}  # infer's routing option
        extra = {"options": options, "format": self.format, "keep_alive": self.keep_alive}
        body.update({k: v for k, v in extra.items() if v not in (None, {})})
        return body

    async def send(self, text: str, *, truncate: bool = True) -> Done | None:
        """One turn, as ``ChatSession.send``: a request error removes the user message again."""
        self.messages.append({"role": "user", "content": text})
        start, times, reply, final = time.perf_counter(), [], [], None
        try:
            async for line in self.client.astream("/api/chat", self.body(truncate=truncate)):
                if line.get("done"):
                    final = line
                    break
                piece = (line.get("message") or {}).get("content") or ""
                if piece:
                    times.append(time.perf_counter() - start)
                    reply.append(piece)
                    self.out.write(piece)
                    self.out.flush()
        except BackendError:
            if not reply:
                self.messages.pop()
                raise
            self.messages.append({"role": "assistant", "content": "".join(reply)})
            raise
        except BaseException:
            self.messages.append({"role": "assistant", "content": "".join(reply)})
            raise
        self.messages.append({"role": "assistant", "content": "".join(reply)})
        self.out.write("\n\n")
        self.out.flush()
        done = done_from_final(final, times) if final else None
        if self.verbose and done is not None:
            self.err.write("".join(line + "\n" for line in stats_lines(done)))
            self.err.flush()
        return done

    async def settle(self, timeout: float = 10.0) -> None:
        """Nothing to wait for: the server writes its own ledger rows."""

    async def aclose(self) -> None:
        pass

    def save(self, name: str) -> None:
        """``/save``: a new model on the server from this one, the system message, parameters and history."""
        body = {"model": name, "from": self.model, "stream": False, "parameters": dict(self.options),
                "messages": list(self.messages)}
        if self.system:
            body["system"] = self.system
        self.client.call("POST", "/api/create", body)

    def list_models(self) -> None:
        rows = [["NAME", "ID", "SIZE", "MODIFIED"]]
        for m in self.client.call("GET", "/api/tags").get("models") or []:
            rows.append([m["name"], (m.get("digest") or "")[:12], human_bytes(m.get("size") or 0),
                         human_time_ago(parse_time(m.get("modified_at")))])
        typer.echo(table(rows))


def done_from_final(final: dict[str, Any], token_times: list[float]) -> Done:
    """The server's final chunk (nanoseconds) as a :class:`Done`; TTFT and TPOT from the arrival times."""
    s = lambda key: (final.get(key) or 0) / 1e9  # noqa: E731 - absent keys are zero (Go's omitempty)
    timings = Timings(load=s("load_duration"), prompt_eval=s("prompt_eval_duration"), eval=s("eval_duration"),
                      total=s("total_duration"), ttft=token_times[0] if token_times else None,
                      token_times=list(token_times), draft_tokens=final.get("draft_count") or 0,
                      accepted_tokens=final.get("draft_accepted_count") or 0)
    usage = Usage(input_tokens=final.get("prompt_eval_count") or 0, output_tokens=final.get("eval_count") or 0,
                  source="backend")
    return Done(finish_reason=final.get("done_reason") or "stop", usage=usage, timings=timings)


def details_from_show(model: str, body: dict[str, Any]) -> ModelDetails:
    """What the REPL's ``/show`` needs, from ``POST /api/show``: the GGUF facts from ``model_info``, the
    template as a TEMPLATE layer only when the server's Modelfile has one (else the GGUF's own)."""
    d = body.get("details") or {}
    config = {"model_family": d.get("family") or "", "model_type": d.get("parameter_size") or "",
              "file_type": d.get("quantization_level") or ""}
    template = body.get("template") or None
    layer = template if '\nTEMPLATE """' in "\n" + (body.get("modelfile") or "") else None
    gguf = _gguf_facts(body.get("model_info") or {}, d.get("quantization_level") or "",
                       None if layer else template)
    return ModelDetails(name=parse_name(model, insecure=True), manifest=None, digest="", modified=0.0,  # type: ignore[arg-type]
                        model_path=None, config=config, gguf=gguf, template=layer,
                        system=body.get("system") or None, licenses=[body["license"]] if body.get("license") else [],
                        parameters=parse_parameters(body.get("parameters") or ""),
                        messages=list(body.get("messages") or []))


def _gguf_facts(info: dict[str, Any], file_type: str, chat_template: str | None) -> GGUFInfo | None:
    arch = info.get("general.architecture")
    if not arch:
        return None
    return GGUFInfo(architecture=arch, parameter_count=int(info.get("general.parameter_count") or 0),
                    file_type=file_type, context_length=info.get(f"{arch}.context_length"),
                    embedding_length=info.get(f"{arch}.embedding_length"), chat_template=chat_template,
                    license=None, metadata=info)


def parse_parameters(text: str) -> dict[str, Any]:
    """``/api/show``'s ``parameters`` text (``key<padding>value``, strings quoted) as a dict; repeats a list."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        key, _, raw = line.strip().partition(" ")
        if not key:
            continue
        try:
            value = json.loads(raw.strip())
        except ValueError:
            value = raw.strip()
        if key in out:
            out[key] = [*out[key], value] if isinstance(out[key], list) else [out[key], value]
        else:
            out[key] = value
    return out

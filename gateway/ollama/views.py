"""Response bodies of the Ollama API: generation chunks and final records, model listings.

Durations are integer nanoseconds, ``created_at`` is RFC 3339 UTC with nanoseconds (``…Z``) and
``modified_at``/``expires_at`` are RFC 3339 in local time, as Ollama's Go encoder writes them.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from core.base import Done, LoadedModel, ModelInfo, TokenLogprob, ToolCall
from adapters.engines.scheduler import RunnerFailure
from frontend.reasoning import thinks
from frontend.tools.parser import supports_tools
from frontend.tools.wire import ollama_call
from registry.details import ModelDetails
from registry.store import LocalModel

# Go's time.Now().Add(math.MaxInt64): what Ollama shows for a model kept loaded forever.
FOREVER = datetime(2262, 4, 11, 23, 47, 16, 854775, tzinfo=timezone.utc)
PARAMETER_WIDTH = 30  # Ollama's show: fmt.Sprintf("%-30s %#v", key, value)


def utc_now() -> str:
    """``2024-12-06T00:48:09.983619123Z`` (trailing zeros dropped, as RFC3339Nano)."""
    ns = time.time_ns()
    secs, frac = divmod(ns, 10**9)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    digits = f"{frac:09d}".rstrip("0")
    return f"{base}.{digits}Z" if digits else f"{base}Z"


def local_time(value: float | datetime) -> str:
    """An epoch time (or datetime) as RFC 3339 in local time: ``2025-05-10T08:06:48.639712-07:00``."""
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(value, timezone.utc)
    text = moment.astimezone().isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def ns(seconds: float | None) -> int:
    return int(round((seconds or 0.0) * 1e9))


def bare_digest(digest: str) -> str:
    return digest.removeprefix("sha256:")


# -- generation -----------------------------------------------------------------------------------

def final_metrics(done: Done) -> dict[str, Any]:
    t, usage = done.timings, done.usage
    out = {"done_reason": done_reason(done), "total_duration": ns(t.total), "load_duration": ns(t.load),
           "prompt_eval_count": usage.input_tokens, "prompt_eval_duration": ns(t.prompt_eval),
           "eval_count": usage.output_tokens, "eval_duration": ns(t.eval)}
    if done.truncated_messages:  # never silent: say how many old messages were dropped
        out["truncated_messages"] = done.truncated_messages
    if t.draft_tokens:  # speculative decoding ran (llama-server's timings.draft_n / draft_n_accepted)
        out["draft_count"], out["draft_accepted_count"] = t.draft_tokens, t.accepted_tokens
    return out


def done_reason(done: Done) -> str:
    return done.finish_reason if done.finish_reason in ("stop", "length") else "stop"


def logprobs_wire(items: list[TokenLogprob]) -> list[dict]:
    return [{"token": lp.token, "logprob": lp.logprob, "bytes": lp.bytes,
             "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in lp.top_logprobs]}
            for lp in items]


def generate_chunk(model: str, text: str, logprobs: list[TokenLogprob] | None = None, *,
                   thinking: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "created_at": utc_now(), "response": text, "done": False}
    if thinking:
        out["thinking"] = thinking
    if logprobs:
        out["logprobs"] = logprobs_wire(logprobs)
    return out


def generate_final(model: str, done: Done, *, text: str = "", raw: bool = False,
                   logprobs: list[TokenLogprob] | None = None, thinking: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "created_at": utc_now(), "response": text, "done": True}
    if thinking:
        out["thinking"] = thinking
    out.update(final_metrics(done))
    if not raw:
        out["context"] = [*(done.prompt_tokens or []), *(done.output_tokens or [])]
    if logprobs:
        out["logprobs"] = logprobs_wire(logprobs)
    return out


def chat_chunk(model: str, text: str, logprobs: list[TokenLogprob] | None = None, *,
               tool_calls: list[ToolCall] | None = None, first_index: int = 0, thinking: str = "") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        message["thinking"] = thinking
    if tool_calls:
        message["tool_calls"] = [ollama_call(c, first_index + i) for i, c in enumerate(tool_calls)]
    out: dict[str, Any] = {"model": model, "created_at": utc_now(), "message": message, "done": False}
    if logprobs:
        out["logprobs"] = logprobs_wire(logprobs)
    return out


def chat_final(model: str, done: Done, *, text: str = "", logprobs: list[TokenLogprob] | None = None,
               tool_calls: list[ToolCall] | None = None, thinking: str = "") -> dict[str, Any]:
    out = chat_chunk(model, text, logprobs, tool_calls=tool_calls, thinking=thinking)
    out["done"] = True
    out.update(final_metrics(done))
    return out


def load_answer(model: str, reason: str, *, chat: bool) -> dict[str, Any]:
    """What /api/generate and /api/chat answer to a request that only loads or unloads a model."""
    out: dict[str, Any] = {"model": model, "created_at": utc_now()}
    out.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    out.update(done=True, done_reason=reason)
    return out


# -- models ---------------------------------------------------------------------------------------

def details_wire(d: ModelDetails | None) -> dict[str, Any]:
    """``details`` of /api/tags, /api/show and /api/ps: GGUF facts, the config blob as fallback."""
    if d is None:
        return {"parent_model": "", "format": "", "family": "", "families": None,
                "parameter_size": "", "quantization_level": ""}
    cfg, g = d.config, d.gguf
    family = (g.architecture if g else "") or cfg.get("model_family", "")
    families = cfg.get("model_families") or ([family] if family else None)
    return {"parent_model": cfg.get("parent_model", ""), "format": "gguf" if g else cfg.get("model_format", ""),
            "family": family,
            "families": families, "parameter_size": (g.parameter_size if g else "") or cfg.get("model_type", ""),
            "quantization_level": (g.file_type if g else "") or cfg.get("file_type", "")}


def tag_entry(m: LocalModel, d: ModelDetails | None) -> dict[str, Any]:
    name = m.name.display
    return {"name": name, "model": name, "modified_at": local_time(m.modified), "size": m.size,
            "digest": bare_digest(m.digest), "details": details_wire(d)}


def remote_details(m: ModelInfo) -> dict[str, Any]:
    """``details`` of a model served by a remote backend: its type stands in for the format."""
    return {"parent_model": m.parent or "", "format": m.owned_by or m.backend, "family": m.family, "families": None,
            "parameter_size": "", "quantization_level": ""}


def remote_tag_entry(m: ModelInfo) -> dict[str, Any]:
    return {"name": m.name, "model": m.name, "modified_at": local_time(m.modified or time.time()), "size": 0,
            "digest": "", "details": remote_details(m), "remote_host": m.backend}


def remote_show_body(m: ModelInfo) -> dict[str, Any]:
    return {"license": "", "modelfile": f"# served by a remote {m.owned_by or m.backend} backend\n", "parameters": "",
            "template": "", "system": "", "details": remote_details(m), "messages": [], "model_info": {},
            "capabilities": ["completion"], "modified_at": local_time(m.modified or time.time())}


def ps_entry(m: LoadedModel, d: ModelDetails | None) -> dict[str, Any]:
    expires = FOREVER if m.expires_at is None else m.expires_at
    entry = {"name": m.name, "model": m.name, "size": m.size, "digest": bare_digest(m.digest),
             "details": details_wire(d), "expires_at": local_time(expires), "size_vram": 0,
             "context_length": m.context_length}
    if m.pid is not None:
        entry["runner"] = {"pid": m.pid, "engine": m.backend, "memory": m.memory or 0, "state": m.state,
                           "requests": m.active, "tensor_parallel": m.tensor_parallel, "pids": m.pids or [m.pid]}
    return entry


def failure_entry(f: RunnerFailure) -> dict[str, Any]:
    return {"name": f.name, "engine": f.engine, "crashes": f.count, "error": f.why, "at": local_time(f.at),
            "retry_at": local_time(f.retry_at)}


def show_body(d: ModelDetails) -> dict[str, Any]:
    template = d.chat_template or ""
    capabilities = ["completion"]
    if supports_tools(d):
        capabilities.append("tools")
    if thinks(d):
        capabilities.append("thinking")
    if d.template and ".Suffix" in d.template:
        capabilities.append("insert")
    return {"license": "\n".join(d.licenses), "modelfile": d.modelfile(), "parameters": parameter_lines(d.parameters),
            "template": template, "system": d.system or "", "details": details_wire(d), "messages": d.messages,
            "model_info": model_info(d), "capabilities": capabilities, "modified_at": local_time(d.modified)}


def model_info(d: ModelDetails) -> dict[str, Any]:
    if d.gguf is None:
        return {}
    info = {key: _plain(value) for key, value in d.gguf.metadata.items() if key != "tokenizer.chat_template"}
    info.setdefault("general.parameter_count", d.gguf.parameter_count)
    return dict(sorted(info.items()))


def parameter_lines(params: dict) -> str:
    """Ollama's ``parameters`` text: one ``key<padding>value`` line per value, strings quoted."""
    lines = []
    for key, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            shown = _go_value(item)
            lines.append(f"{key:<{PARAMETER_WIDTH}} {shown}")
    return "\n".join(lines)


def _go_value(item: Any) -> str:
    if isinstance(item, bool):
        return str(item).lower()
    if isinstance(item, str):
        return '"' + item.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return str(item)


def _plain(value: Any) -> Any:
    """GGUF metadata as JSON-safe Python values (numpy scalars and arrays included)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value

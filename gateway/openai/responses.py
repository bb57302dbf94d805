"""OpenAI response bodies: ids, usage, logprobs, and the non-streaming chat/completion objects.

One :class:`ResponseMeta` per request carries the ``id``, ``created`` and ``model`` every object
of that response repeats (a stream has exactly one of each), and whether the request forced one named
function (its choices then finish with ``stop``, as OpenAI's and vLLM's do).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.base import Chunk, Done, TokenLogprob, ToolCall
from frontend.tools.wire import openai_call

SYSTEM_FINGERPRINT = "fp_infer"


@dataclass
class ResponseMeta:
    kind: str  # "chat.completion" or "text_completion"
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    named_call: bool = False  # tool_choice named a function

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl" if self.kind == "chat.completion" else "cmpl"
            self.id = f"{prefix}-{secrets.token_hex(12)}"

    def envelope(self, choices: list[dict], *, stream: bool) -> dict:
        obj = f"{self.kind}.chunk" if stream and self.kind == "chat.completion" else self.kind
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices}


def finish_reason(done: Done, *, called: bool = False, named: bool = False) -> str:
    """``tool_calls`` when the choice ended after calling tools the model chose to call, ``length`` when
    cut, else ``stop`` (also after a call the request named: OpenAI and vLLM say ``stop`` then)."""
    if done.finish_reason == "length":
        return "length"
    return "tool_calls" if called and not named else "stop"


def backend_fields(done: Done) -> dict:
    """What a choice adds after ``finish_reason`` when the backend said it: vLLM's ``stop_reason`` (the
    stop string that ended it) and the choice fields a request's passed-on fields asked for
    (``prompt_logprobs``), as the backend sent them."""
    out = {"stop_reason": done.stop_sequence} if done.stop_sequence is not None else {}
    return {**out, **done.choice_fields} if done.choice_fields else out


def usage(dones: Sequence[Done], prompt_of: Sequence[int] | None = None) -> dict:
    """Usage over all choices: each distinct prompt counted once, every completion summed.

    ``prompt_of[i]`` is the prompt index of choice ``i`` (legacy completions accept several prompts).
    """
    prompt_of = prompt_of or [0] * len(dones)
    firsts: dict[int, Done] = {}
    for idx, done in zip(prompt_of, dones):
        firsts.setdefault(idx, done)
    prompt = sum(d.usage.input_tokens for d in firsts.values())
    completion = sum(d.usage.output_tokens for d in dones)
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    cached = [d.usage.cached_input_tokens for d in firsts.values()]
    if cached and all(c is not None for c in cached):
        out["prompt_tokens_details"] = {"cached_tokens": sum(cached)}
    reasoning = [d.usage.reasoning_tokens for d in dones if d.usage.reasoning_tokens is not None]
    if reasoning:
        out["completion_tokens_details"] = {"reasoning_tokens": sum(reasoning)}
    return out


# -- logprobs -------------------------------------------------------------------------------------

def chat_logprob(entry: TokenLogprob) -> dict:
    return {"token": entry.token, "logprob": entry.logprob, "bytes": entry.bytes,
            "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes}
                             for t in entry.top_logprobs]}


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict:
    return {"content": [chat_logprob(e) for e in entries]}


def legacy_logprobs(entries: Sequence[TokenLogprob], offset: int = 0) -> dict:
    """``{tokens, token_logprobs, top_logprobs, text_offset}``; offsets count characters of the completion."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for entry in entries:
        out["tokens"].append(entry.token)
        out["token_logprobs"].append(entry.logprob)
        top: dict | None = {t.token: t.logprob for t in entry.top_logprobs}
        if entry.logprob is None:  # an echoed first prompt token has none (vLLM: null, null)
            top = top or None
        else:
            top.setdefault(entry.token, entry.logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(entry.token)
    return out


def all_logprobs(chunks: Sequence[Chunk]) -> list[TokenLogprob]:
    return [entry for chunk in chunks for entry in (chunk.logprobs or [])]


# -- non-streaming bodies -------------------------------------------------------------------------

def tool_calls(chunks: Sequence[Chunk]) -> list[ToolCall]:
    return [call for chunk in chunks for call in chunk.tool_calls]


def assistant_message(text: str, calls: Sequence[ToolCall], thinking: str = "") -> dict:
    """The reply; with tool calls, ``content`` is null when the model wrote nothing else (as OpenAI);
    a thinking model's reasoning in ``reasoning_content`` (vLLM's name), before the content."""
    out: dict = {"role": "assistant"}
    if thinking:
        out["reasoning_content"] = thinking
    if not calls:
        out["content"] = text
        return out
    out.update(content=text or None, tool_calls=[openai_call(c) for c in calls])
    return out


Result = tuple[str, list[Chunk], Done]


def chat_completion(meta: ResponseMeta, results: Sequence[Result], *, logprobs: bool) -> dict:
    choices = []
    for i, (text, chunks, done) in enumerate(results):
        calls = tool_calls(chunks)
        thinking = "".join(c.thinking for c in chunks)
        choices.append({"index": i, "message": assistant_message(text, calls, thinking),
                        "logprobs": chat_logprobs(all_logprobs(chunks)) if logprobs else None,
                        "finish_reason": finish_reason(done, called=bool(calls), named=meta.named_call),
                        **backend_fields(done)})
    body = meta.envelope(choices, stream=False)
    body["usage"] = usage([done for _, _, done in results])
    return with_kv_transfer(body, results)


def text_completion(meta: ResponseMeta, results: Sequence[Result], prompt_of: Sequence[int], *,
                    logprobs: bool) -> dict:
    choices = [{"index": i, "text": text,
                "logprobs": legacy_logprobs(all_logprobs(chunks)) if logprobs else None,
                "finish_reason": finish_reason(done), **backend_fields(done)}
               for i, (text, chunks, done) in enumerate(results)]
    body = meta.envelope(choices, stream=False)
    body["usage"] = usage([done for _, _, done in results], prompt_of)
    return with_kv_transfer(body, results)


def with_kv_transfer(body: dict, results: Sequence[Result]) -> dict:
    """A prefill leg's reply carries its ``kv_transfer_params`` at the top level, as vLLM's does."""
    params = next((done.kv_transfer_params for _, _, done in results if done.kv_transfer_params), None)
    if params is not None:
        body["kv_transfer_params"] = params
    return body

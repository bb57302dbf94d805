"""One generation on one llama.cpp context, run synchronously in a worker thread.

``GenerationJob.run(llm, emit)`` renders and tokenizes the prompt, checks it against the context
window, reuses the longest cached prefix of the previous request on this slot, then samples tokens
and emits :class:`Chunk` events until EOS, a stop string, ``num_predict``, the context end or
cancellation; it returns the :class:`Done` record. Request errors are raised before anything is
emitted.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from core.base import Chunk, Done, GenerationRequest, Timings, TokenLogprob, Usage
from frontend.chat_format import PromptSpec, render_request
from core.errors import InvalidRequest
from core.options import check_prompt_bytes, check_room, check_token_ids
from core.options import Options
from frontend.textstream import TextStream


class Refused(Exception):
    """``admit`` refused the request (its key's budget or limits): ``error`` is the answer."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


@dataclass
class GenerationJob:
    request: GenerationRequest
    options: Options
    spec: PromptSpec
    cancel: threading.Event = field(default_factory=threading.Event)
    timings: Timings = field(default_factory=Timings)
    # A keyed request's admission (``GenerationRequest.admit``, from this thread): called with the
    # prompt's tokens and the context before anything is evaluated; answers the most tokens to generate.
    admit: Callable[[int, int], int | None] | None = None
    cap: int | None = None

    def run(self, llm: llama_cpp.Llama, emit: Callable[[Chunk], None]) -> Done:
        n_ctx = context_size(llm)
        if self.request.prompt_tokens is not None:  # token ids from the client go to the model as they are
            tokens, dropped = check_token_ids(self.request.prompt_tokens, llm.n_vocab()), 0
        else:
            prompt, dropped = self._render(llm)
            if len(prompt) > n_ctx * _CHEAP_BYTES_PER_TOKEN:  # long enough to be worth the vocabulary scan
                check_prompt_bytes(prompt, n_ctx, max_token_bytes(llm))
            tokens = self._tokenize(llm, prompt)
        check_room(len(tokens), n_ctx, self.options.num_predict, strict=self.request.strict_max_tokens)
        if self.admit is not None:
            self.cap = self.admit(len(tokens), n_ctx)
        t0 = time.perf_counter()
        cached = _reuse_prefix(llm, tokens)
        llm.eval(tokens[cached:])
        self.timings.prompt_eval = time.perf_counter() - t0
        output, reason, matched = self._sample(llm, tokens, emit)
        self.timings.eval = time.perf_counter() - t0 - self.timings.prompt_eval
        usage = Usage(input_tokens=len(tokens), output_tokens=len(output), cached_input_tokens=cached)
        return Done(finish_reason=reason, usage=usage, timings=self.timings, prompt_tokens=tokens,
                    output_tokens=output, truncated_messages=dropped, stop_sequence=matched)

    # -- prompt ---------------------------------------------------------------------------------

    def _render(self, llm: llama_cpp.Llama) -> tuple[str, int]:
        n_ctx = context_size(llm)

        def count(text: str) -> int:  # past the byte bound it cannot fit: no need to tokenize it all
            if len(text) > n_ctx * _CHEAP_BYTES_PER_TOKEN and len(text) > n_ctx * max_token_bytes(llm):
                return n_ctx + 1
            return len(self._tokenize(llm, text))
        return render_request(self.spec, self.request, count, context_size(llm) - 1)

    def _tokenize(self, llm: llama_cpp.Llama, text: str) -> list[int]:
        add_bos = llm._model.add_bos_token() and not (self.spec.bos_token and text.startswith(self.spec.bos_token))
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800") that reached us: the request's fault
            raise InvalidRequest(f"the prompt is not valid Unicode ({exc.reason} at position {exc.start})") from None
        return llm.tokenize(data, add_bos=add_bos, special=True)

    # -- sampling -------------------------------------------------------------------------------

    def _sample(self, llm: llama_cpp.Llama, prompt: list[int], emit: Callable[[Chunk], None]):
        opts, req = self.options, self.request
        llm.set_seed(opts.sampling_seed())
        llm.last_n_tokens_size = context_size(llm) if opts.repeat_last_n < 0 else opts.repeat_last_n
        text = TextStream(opts.stop)
        limit = _max_new_tokens(opts.num_predict, len(prompt), context_size(llm))
        if self.cap is not None:
            limit = min(limit, self.cap)
        output: list[int] = []
        reason = "length"
        vocab = llm._model.vocab
        for token in llm.generate(prompt, reset=True, **_sampler_kwargs(opts), grammar=_grammar(req.format)):
            if self.cancel.is_set():
                reason = "cancelled"
                break
            if not opts.ignore_eos and llama_cpp.llama_vocab_is_eog(vocab, token):
                reason = "stop"
                break
            output.append(token)
            self.timings.token_times.append(time.perf_counter() - req.arrival)
            if self.timings.ttft is None:
                self.timings.ttft = self.timings.token_times[0]
            piece = text.feed(llm.detokenize([token], special=True))
            logprobs = _logprobs(llm, token, req.top_logprobs) if req.logprobs else None
            if piece or logprobs:
                emit(Chunk(text=piece, token_ids=[token], logprobs=logprobs))
            if text.stopped:
                reason = "stop"
                break
            if len(output) >= limit:
                break
        tail = text.flush()
        if tail:
            emit(Chunk(text=tail))
        return output, reason, text.matched


_CHEAP_BYTES_PER_TOKEN = 8  # below n_ctx * 8 characters a prompt tokenizes in milliseconds: no bound needed


def max_token_bytes(llm: llama_cpp.Llama) -> int:
    """The longest vocabulary entry in bytes, measured once per loaded context."""
    cached = getattr(llm, "_infer_max_token_bytes", None)
    if cached is None:
        cached = max((len(llm.detokenize([t], special=True)) for t in range(llm.n_vocab())), default=1)
        llm._infer_max_token_bytes = cached  # noqa: SLF001
    return cached


def context_size(llm: llama_cpp.Llama) -> int:
    """The usable window: llama.cpp pads its context (to 256), but the Python side keeps
    ``input_ids`` at the requested ``n_ctx``, so the smaller of the two is the real limit."""
    return min(llm.n_ctx(), len(llm.input_ids))


def _max_new_tokens(num_predict: int, n_prompt: int, n_ctx: int) -> int:
    room = n_ctx - n_prompt
    return room if num_predict < 0 else min(num_predict, room)


def _reuse_prefix(llm: llama_cpp.Llama, tokens: list[int]) -> int:
    """Keep the KV entries shared with the previous prompt on this slot; return how many."""
    common = 0
    for a, b in zip(llm.input_ids[: llm.n_tokens], tokens):
        if a != b:
            break
        common += 1
    common = min(common, len(tokens) - 1)  # always evaluate at least one token for fresh logits
    if common > 0 and llm._ctx.kv_cache_seq_rm(-1, common, -1):
        llm.n_tokens = common
        return common
    llm.reset()
    return 0


def _sampler_kwargs(opts: Options) -> dict:
    return dict(top_k=opts.top_k, top_p=opts.top_p, min_p=opts.min_p, typical_p=opts.typical_p,
                temp=opts.temperature, repeat_penalty=opts.repeat_penalty,
                frequency_penalty=opts.frequency_penalty, presence_penalty=opts.presence_penalty)


_GRAMMARS: dict[str, llama_cpp.LlamaGrammar] = {}


def _grammar(fmt: str | dict | None) -> llama_cpp.LlamaGrammar | None:
    if not fmt:
        return None
    if fmt == "json":
        key, build = "json", lambda: llama_cpp.LlamaGrammar.from_string(llama_cpp.llama_grammar.JSON_GBNF, verbose=False)
    elif isinstance(fmt, dict):
        key = json.dumps(fmt, sort_keys=True)
        build = lambda: llama_cpp.LlamaGrammar.from_json_schema(key, verbose=False)  # noqa: E731
    else:
        raise InvalidRequest(f"invalid format {fmt!r}: use \"json\" or a JSON schema object", param="format")
    if key not in _GRAMMARS:
        try:
            _GRAMMARS[key] = build()
        except Exception as exc:  # llama.cpp raises ValueError/RuntimeError on a bad schema
            raise InvalidRequest(f"invalid JSON schema in format: {exc}", param="format") from None
    return _GRAMMARS[key]


def _logprobs(llm: llama_cpp.Llama, token: int, top: int) -> list[TokenLogprob]:
    """Log-probabilities of the model's distribution (before sampling transforms), as vLLM reports."""
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
    logits = logits.astype(np.float64)
    logz = logits.max() + np.log(np.exp(logits - logits.max()).sum())
    lp = logits - logz
    entry = _entry(llm, token, float(lp[token]))
    if top > 0:
        best = np.argpartition(-lp, top - 1)[:top] if top < len(lp) else np.arange(len(lp))
        best = best[np.argsort(-lp[best])]
        entry.top_logprobs = [_entry(llm, int(t), float(lp[t])) for t in best]
    return [entry]


def _entry(llm: llama_cpp.Llama, token: int, logprob: float) -> TokenLogprob:
    raw = llm.detokenize([token], special=True)
    return TokenLogprob(token=raw.decode("utf-8", errors="replace"), logprob=logprob, bytes=list(raw))

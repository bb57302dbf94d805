"""Servers as targets: the OpenAI completions API (vLLM, llama.cpp's server, `infer serve`, any
OpenAI-compatible server) and Ollama's ``/api/generate`` (Ollama, `infer serve`).

A server reports the top-k log-probabilities of each token it generates (OpenAI ``logprobs: k``,
Ollama ``logprobs`` + ``top_logprobs``), never the whole vocabulary. Teacher forcing A's tokens on a
server:

- in one request where the API has prompt log-probabilities: vLLM's ``prompt_logprobs: k`` on
  ``/v1/completions`` returns, for every prompt token, its log-probability and the top-k at that
  position; the last n of them are A's n tokens (checked token by token before they are used);
- otherwise one request per position: the prompt plus A's first i tokens, ``max_tokens: 1``,
  temperature 0, and the top-k of the one token it returns.

The prompt plus A's tokens goes as token ids where A is an engine and the API takes them (OpenAI
completions on vLLM and `infer serve`), else as raw text (Ollama's API with ``raw: true``; llama.cpp's
server). Text is re-tokenized by the server, so a position is only scored from text where A's tokens
survive that round trip (``Continuation.canonical``, checked with A's tokenizer); the others are
reported as not compared. The OpenAI completions API takes raw text on vLLM and llama.cpp's server,
but Ollama and `infer serve` apply the model's chat template to a text prompt there: with a text-only
comparison, point a target at their ``/api``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import httpx

from .target import Continuation, Dist, Piece, TargetError, TargetInfo

log = logging.getLogger(__name__)
TIMEOUT = httpx.Timeout(120.0, connect=10.0)
# Greedy and unpenalised on every server we know: llama.cpp's server defaults repeat_penalty to 1.1.
GREEDY = {"temperature": 0.0, "top_p": 1.0, "repeat_penalty": 1.0, "seed": 0}


class _ServerTarget:
    vocab = None

    def __init__(self, info: TargetInfo, base_url: str, model: str, key_env: str | None) -> None:
        self.info, self.base_url, self.model = info, base_url.rstrip("/"), model
        headers = {}
        if key_env:
            key = os.environ.get(key_env)
            if not key:
                raise TargetError(f"{info.spec}: the environment variable {key_env} (key_env) is not set")
            headers["authorization"] = f"Bearer {key}"
        self.client = httpx.Client(base_url=self.base_url, timeout=TIMEOUT, headers=headers)

    def _post(self, path: str, body: dict[str, Any], *, refusable: bool = False) -> dict | None:
        """The JSON reply; None for any error status when ``refusable``: a probe of a field the server may
        not take (llama.cpp's server answers a token-id prompt with 500 and a validation error)."""
        try:
            response = self.client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise TargetError(f"{self.info.spec}: {self.base_url}{path} did not answer: {exc}") from None
        if refusable and response.status_code >= 400:
            return None
        if response.status_code >= 400:
            raise TargetError(f"{self.info.spec}: {self.base_url}{path} answered {response.status_code}: "
                              f"{response.text[:300]}")
        try:
            return response.json()
        except ValueError:
            raise TargetError(f"{self.info.spec}: {self.base_url}{path} answered with something other than "
                              "JSON") from None

    def generate_greedy(self, prompts: list[str], max_tokens: int, top_k: int,
                        stop: list[str] | None = None) -> list[Continuation]:
        return [self._generate(prompt, max_tokens, top_k, stop) for prompt in prompts]

    def score(self, continuation: Continuation, top_k: int) -> list[Dist | None]:
        """One request per position, from the prompt plus A's first i tokens as text."""
        return [self._next(prefix, top_k) if prefix is not None else None for prefix in text_prefixes(continuation)]

    def _next(self, prefix: str | list[int], top_k: int) -> Dist | None:
        generated = self._generate(prefix, 1, top_k, None)
        return generated.dists[0] if generated.dists else None

    def _generate(self, prompt: str | list[int], max_tokens: int, top_k: int, stop: list[str] | None
                  ) -> Continuation:
        raise NotImplementedError

    def close(self) -> None:
        self.client.close()


class OllamaTarget(_ServerTarget):
    """``POST /api/generate`` with ``raw: true``; each logprob entry carries the token's ``bytes``."""

    def _generate(self, prompt: str | list[int], max_tokens: int, top_k: int, stop: list[str] | None
                  ) -> Continuation:
        assert isinstance(prompt, str)  # Ollama's API takes text
        options = {**GREEDY, "num_predict": max_tokens, "ignore_eos": max_tokens == 1}
        if stop:
            options["stop"] = stop
        body = {"model": self.model, "prompt": prompt, "raw": True, "stream": False, "options": options,
                "logprobs": True, "top_logprobs": top_k}
        reply = self._post("/api/generate", body)
        entries = reply.get("logprobs") or []
        pieces = [Piece(None, _entry_bytes(e)) for e in entries]
        if not entries and reply.get("response"):  # a server without logprobs: the text only
            pieces = [Piece(None, reply["response"].encode())]
        dists = [_top([(_entry_bytes(t), t["logprob"]) for t in e.get("top_logprobs") or []],
                      _entry_bytes(e), e.get("logprob")) for e in entries]
        return Continuation(prompt, pieces, reply.get("done_reason"), dists=dists if entries else None)


class OpenAITarget(_ServerTarget):
    """``POST /v1/completions`` with ``logprobs: k``; token-id prompts where the server takes them;
    vLLM's ``prompt_logprobs`` when the server has it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prompt_logprobs: bool | None = None  # unknown until the first score
        self.token_prompts: bool | None = None

    def _body(self, prompt: str | list[int], max_tokens: int, top_k: int, stop: list[str] | None) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "logprobs": top_k, **GREEDY}
        if max_tokens == 1:
            body["ignore_eos"] = True  # vLLM and infer serve: the distribution even where EOS is greedy
        if stop:
            body["stop"] = stop
        return body

    def _generate(self, prompt: str | list[int], max_tokens: int, top_k: int, stop: list[str] | None
                  ) -> Continuation:
        reply = self._post("/v1/completions", self._body(prompt, max_tokens, top_k, stop))
        choice = _first_choice(reply, self.info.spec)
        tokens = (choice.get("logprobs") or {}).get("tokens") or []
        pieces = [Piece(None, t.encode("utf-8")) for t in tokens]
        if not tokens and choice.get("text"):
            pieces = [Piece(None, choice["text"].encode())]
        text = prompt if isinstance(prompt, str) else ""
        return Continuation(text, pieces, choice.get("finish_reason"), dists=self._dists(choice) if tokens else None)

    @staticmethod
    def _dists(choice: dict) -> list[Dist]:
        """The legacy ``logprobs`` object: ``tokens``, ``token_logprobs``, ``top_logprobs`` ({text: logprob})."""
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        tops = logprobs.get("top_logprobs") or [None] * len(tokens)
        chosen = logprobs.get("token_logprobs") or [None] * len(tokens)
        return [_top([(k.encode("utf-8"), v) for k, v in (top or {}).items()], t.encode("utf-8"), lp)
                for top, t, lp in zip(tops, tokens, chosen, strict=False)]

    def score(self, continuation: Continuation, top_k: int) -> list[Dist | None]:
        if not continuation.pieces:
            return []
        if self.prompt_logprobs is not False:
            dists = self._prompt_logprobs(continuation, top_k)
            if dists is not None:
                return dists
        ids = continuation.token_ids
        if ids is not None and self.token_prompts is not False:
            dists = self._score_by_ids(continuation, ids, top_k)
            if dists is not None:
                return dists
        return super().score(continuation, top_k)

    def _score_by_ids(self, continuation: Continuation, ids: list[int], top_k: int) -> list[Dist | None] | None:
        """One request per position with a token-id prompt; None if the server takes no token ids (the
        first request tells)."""
        start = len(ids) - len(continuation.pieces)
        reply = self._post("/v1/completions", self._body(ids[:start], 1, top_k, None),
                           refusable=self.token_prompts is None)
        if reply is None:
            log.info("%s takes no token-id prompts: scoring from text", self.info.spec)
            self.token_prompts = False
            return None
        self.token_prompts = True
        first = self._dists(_first_choice(reply, self.info.spec))
        return [first[0] if first else None] + [self._next(ids[: start + i], top_k)
                                                for i in range(1, len(continuation.pieces))]

    def _prompt_logprobs(self, continuation: Continuation, top_k: int) -> list[Dist | None] | None:
        """vLLM: one request; None when the server has no prompt_logprobs or tokenized A's text otherwise."""
        ids = continuation.token_ids if self.token_prompts is not False else None
        prompt = ids if ids is not None else continuation.prompt + continuation.text
        body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": top_k, **GREEDY}
        reply = self._post("/v1/completions", body, refusable=True)
        entries = _first_choice(reply, self.info.spec).get("prompt_logprobs") if reply is not None else None
        if not isinstance(entries, list):
            if self.prompt_logprobs is None:
                log.info("%s has no prompt_logprobs: scoring one position per request", self.info.spec)
            self.prompt_logprobs = False
            return None
        self.prompt_logprobs = True
        n = len(continuation.pieces)
        tail = entries[-n:] if len(entries) >= n else []
        by_id = continuation.pieces if ids is not None else [Piece(None, p.bytes) for p in continuation.pieces]
        dists = [_vllm_dist(entry, piece) for entry, piece in zip(tail, by_id, strict=False)]
        if len(dists) != n or any(d is None for d in dists):
            log.info("%s tokenized A's text otherwise: scoring one position per request", self.info.spec)
            return None
        return dists


def text_prefixes(continuation: Continuation) -> list[str | None]:
    """The prompt plus A's first i tokens as text, for each position i; None where that text would not
    tokenize back to A's tokens (``canonical``) or cuts a UTF-8 character."""
    out, done = [], b""
    canonical = continuation.canonical or [True] * len(continuation.pieces)
    for piece, ok in zip(continuation.pieces, canonical, strict=True):
        try:
            out.append(continuation.prompt + done.decode("utf-8") if ok else None)
        except UnicodeDecodeError:
            out.append(None)
        done += piece.bytes
    return out


def _entry_bytes(entry: dict) -> bytes:
    raw = entry.get("bytes")
    return bytes(raw) if isinstance(raw, list) else str(entry.get("token", "")).encode("utf-8")


def ambiguous(key: bytes) -> bool:
    """A token printed as text from a cut UTF-8 character: "" (llama.cpp's server) or "\ufffd"."""
    return key == b"" or "\ufffd".encode() in key


def _top(top: list[tuple[bytes, float]], chosen: bytes, chosen_logprob: float | None) -> Dist:
    """A server's top-k plus the token it chose; ambiguous tokens, and bytes that several listed
    tokens share, are left out (neither side could be matched)."""
    entries = [*top, *([(chosen, chosen_logprob)] if chosen_logprob is not None else [])]
    known: dict[bytes, float] = {}
    seen: dict[bytes, set[float]] = {}
    for key, logprob in entries:
        seen.setdefault(key, set()).add(round(float(logprob), 9))
        known[key] = float(logprob)
    clean = {k: v for k, v in known.items() if not ambiguous(k) and len(seen[k]) == 1}
    return Dist(clean, greedy=None if ambiguous(chosen) else chosen)


def _vllm_dist(entry: dict | None, piece: Piece) -> Dist | None:
    """One vLLM prompt_logprobs entry ({token_id: {logprob, rank, decoded_token}}) if it holds A's token:
    found by id where the prompt went as ids, else by its text."""
    if not entry:
        return None
    named = {key: (piece.bytes if piece.id is not None and key == str(piece.id)
                   else str(v.get("decoded_token", "")).encode("utf-8"), v) for key, v in entry.items()}
    first = [name for name, v in named.values() if v.get("rank") == 1]
    dist = _top([(name, float(v["logprob"])) for name, v in named.values()], first[0] if first else b"", None)
    found = str(piece.id) in entry if piece.id is not None else piece.bytes in dist.top
    return dist if found else None


def _first_choice(reply: dict, spec: str) -> dict:
    choices = reply.get("choices")
    if not choices:
        raise TargetError(f"{spec}: the completion has no choices: {str(reply)[:200]}")
    return choices[0]

"""Benchmark prompts: synthetic ones with exact token counts, or a ShareGPT-style dataset file.

Synthetic prompts are built from the target's own vocabulary: whole-word tokens (a space then letters)
that encode back to themselves, sampled with a seeded generator, so ``encode(prompt)`` has exactly the
asked length. Every prompt starts with its own random words, so no prefix cache can serve one prompt
from another, unless ``shared_prefix`` is set: then every other prompt (the 2nd, 4th, ...) starts
with one fixed prefix of that many tokens and goes on with its own words, so half the prompts can
be served partly from a prefix cache and half cannot (what ``cost.cached_prefill_weight`` compares).
Without a tokenizer, words stand in for tokens and the lengths are marked inexact.

Datasets: JSON (a list) or JSONL (one object a line) of ShareGPT ``{"conversations": [{"from": "human",
"value": ...}, {"from": "gpt", "value": ...}]}``, OpenAI ``{"messages": [{"role", "content"}...]}`` or
``{"prompt": ..., "completion": ...}`` objects; the first user turn is the prompt, the first reply's
length the output length (unless an output length is given).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .records import BenchRequest
from .tokenizer import TokenCounter

_WORD_TOKEN = re.compile(rb"^ [a-z]{2,12}$")
_FALLBACK_WORDS = ("alpha", "river", "stone", "cloud", "green", "table", "music", "light", "paper", "seven",
                   "north", "quiet", "lemon", "glass", "horse", "maple", "ocean", "tiger", "bread", "chair")


@dataclass(frozen=True)
class LengthSpec:
    """A token length: mean and standard deviation (0 = fixed), parsed from ``"256"`` or ``"256:32"``."""

    mean: int
    stdev: float = 0.0

    @classmethod
    def parse(cls, text: str) -> LengthSpec:
        mean, _, stdev = text.partition(":")
        try:
            spec = cls(int(mean), float(stdev) if stdev else 0.0)
        except ValueError:
            raise ValueError(f"token length {text!r} is not N or N:STDEV") from None
        if spec.mean < 1 or spec.stdev < 0:
            raise ValueError(f"token length {text!r} needs N >= 1 and STDEV >= 0")
        return spec

    def sample(self, rng: np.random.Generator, n: int) -> list[int]:
        if self.stdev == 0:
            return [self.mean] * n
        return [max(1, int(round(x))) for x in rng.normal(self.mean, self.stdev, n)]


def synthetic_requests(counter: TokenCounter | None, num: int, input_len: LengthSpec, output_len: LengthSpec,
                       *, seed: int = 0, shared_prefix: int = 0) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    ins, outs = input_len.sample(rng, num), output_len.sample(rng, num)
    if counter is None:
        words = [" " + w for w in _FALLBACK_WORDS]
        requests = [BenchRequest("".join(rng.choice(words, n)).lstrip(), n, o, is_prompt_len_exact=False)
                    for n, o in zip(ins, outs)]
        prefix = "".join(rng.choice(words, shared_prefix)).lstrip() + " " if shared_prefix else ""
    else:
        vocab = word_tokens(counter, rng)
        requests = [_exact_prompt(counter, vocab, rng, n, o) for n, o in zip(ins, outs)]
        prefix = _exact_prompt(counter, vocab, rng, shared_prefix, 0).prompt if shared_prefix else ""
    return [_with_prefix(r, prefix, shared_prefix, counter) if prefix and i % 2 else r for i, r in enumerate(requests)]


def _with_prefix(request: BenchRequest, prefix: str, tokens: int, counter: TokenCounter | None) -> BenchRequest:
    """The request's prompt after the shared prefix (its own words first, so only the prefix is shared)."""
    prompt = prefix + request.prompt
    length = counter.count(prompt) if counter is not None else request.prompt_len + tokens
    return BenchRequest(prompt, length, request.output_len, is_prompt_len_exact=request.is_prompt_len_exact)


def word_tokens(counter: TokenCounter, rng: np.random.Generator, limit: int = 3000) -> list[str]:
    """Whole-word tokens of this vocabulary that encode back to themselves, alone and side by side."""
    candidates = [piece.decode() for piece in map(counter.token_bytes, range(counter.vocab_size))
                  if _WORD_TOKEN.match(piece)]
    rng.shuffle(candidates)
    words = [w for w in candidates[:limit] if counter.count(w) == 1]
    if len(words) < 16:
        raise ValueError("the tokenizer has too few whole-word tokens to build exact-length prompts")
    return words


def _exact_prompt(counter: TokenCounter, vocab: list[str], rng: np.random.Generator,
                  n: int, output_len: int) -> BenchRequest:
    pieces = list(rng.choice(vocab, n))
    for _ in range(8):  # whole-word tokens rarely merge; trim or top up if they did
        length = counter.count("".join(pieces))
        if length > n:
            del pieces[max(1, len(pieces) - (length - n)):]
        elif length < n:
            pieces += list(rng.choice(vocab, n - length))
        else:
            break
    length = counter.count("".join(pieces))
    return BenchRequest("".join(pieces), length, output_len, is_prompt_len_exact=length == n)


def dataset_requests(path: Path, counter: TokenCounter | None, num: int, output_len: LengthSpec | None,
                     *, seed: int = 0) -> list[BenchRequest]:
    """Up to ``num`` prompts from the file (shuffled with the seed; cycled if the file has fewer)."""
    pairs = [p for p in map(_pair, _load_rows(path)) if p is not None]
    if not pairs:
        raise ValueError(f"{path}: no prompts found (expected ShareGPT conversations, messages or prompt fields)")
    order = np.random.default_rng(seed).permutation(len(pairs))
    count = counter.count if counter else (lambda s: len(s.split()))
    rng = np.random.default_rng(seed + 1)
    requests = []
    for i in range(num):
        prompt, reply = pairs[order[i % len(pairs)]]
        out = output_len.sample(rng, 1)[0] if output_len else max(1, count(reply) if reply else 128)
        requests.append(BenchRequest(prompt, count(prompt), out, is_prompt_len_exact=counter is not None))
    return requests


def _load_rows(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read dataset {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        pass
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
    return rows


def _pair(row: object) -> tuple[str, str] | None:
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("prompt"), str):
        return row["prompt"], str(row.get("completion") or row.get("response") or "")
    turns = row.get("conversations") or row.get("messages") or []
    texts = [(t.get("from") or t.get("role"), t.get("value") or t.get("content")) for t in turns if isinstance(t, dict)]
    users = [i for i, (who, text) in enumerate(texts) if who in ("human", "user") and isinstance(text, str)]
    if not users:
        return None
    first = users[0]
    reply = texts[first + 1][1] if first + 1 < len(texts) and isinstance(texts[first + 1][1], str) else ""
    return texts[first][1], reply

"""What `infer compare` needs from a model it compares: the ``Target`` protocol and the values it trades.

A target greedy-generates continuations of text prompts and scores a continuation (teacher forcing):
the next-token distribution at each of its positions, given the prompt and the tokens before it.
Two kinds implement it: in-process engines (``accuracy/engines.py``: the native engine and
llama.cpp, whose distributions cover the whole vocabulary) and HTTP servers (``accuracy/remote.py``:
OpenAI or Ollama APIs, whose distributions are the top-k log-probabilities they return).

Tokens are matched across targets by their bytes (OpenAI's and Ollama's ``bytes`` field), and by id
when both sides are engines over the same vocabulary.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class TargetError(Exception):
    """A target that cannot be built, reached or compared; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Piece:
    """One generated token: its id when the target exposes ids, and its bytes."""

    id: int | None
    bytes: bytes

    @property
    def text(self) -> str:
        return self.bytes.decode("utf-8", errors="replace")


class Vocab:
    """An engine's vocabulary: each id's bytes, and the ids that share each byte string."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.index: dict[bytes, list[int]] = {}
        for token_id, piece in enumerate(pieces):
            self.index.setdefault(piece, []).append(token_id)
        self.fingerprint = hashlib.sha256(b"\0".join(pieces)).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.pieces)

    def same_as(self, other: Vocab | None) -> bool:
        return other is not None and other.fingerprint == self.fingerprint

    def id_of(self, piece: bytes) -> int | None:
        """The one id whose bytes are ``piece``; None if none or several."""
        ids = self.index.get(piece)
        return ids[0] if ids and len(ids) == 1 else None


def _logsumexp(values: np.ndarray) -> float:
    top = float(values.max())
    return top + math.log(float(np.exp(values - top).sum()))


@dataclass(slots=True)
class Dist:
    """The next-token distribution at one position: the top-k log-probabilities by token bytes, and
    for an engine the whole row of log-probabilities (float64) over its vocabulary. A server's
    ``greedy`` is the token it chose there (its most likely); None when its bytes are unknown (an
    API that prints tokens as text loses the bytes of a token cut inside a UTF-8 character)."""

    top: dict[bytes, float]
    row: np.ndarray | None = None
    vocab: Vocab | None = None
    greedy: bytes | None = None

    @classmethod
    def from_row(cls, row: np.ndarray, vocab: Vocab, k: int) -> Dist:
        k = max(1, min(k, len(row)))
        ids = np.argpartition(-row, k - 1)[:k]
        top: dict[bytes, float] = {}
        for token_id in ids[np.argsort(-row[ids])]:
            key = vocab.pieces[int(token_id)]
            top[key] = float(np.logaddexp(top[key], row[token_id])) if key in top else float(row[token_id])
        return cls(top, row, vocab)

    def logprob(self, key: bytes) -> float | None:
        """log p(token with these bytes); None where this side does not know it."""
        if self.row is None or self.vocab is None:
            return self.top.get(key)
        ids = self.vocab.index.get(key)
        return _logsumexp(self.row[ids]) if ids else None

    def best(self) -> bytes | None:
        """The bytes of the most likely token; None where a server's choice has unknown bytes."""
        if self.row is not None and self.vocab is not None:
            return self.vocab.pieces[int(self.row.argmax())]
        return self.greedy

    def best_id(self) -> int | None:
        return int(self.row.argmax()) if self.row is not None else None

    def truncated(self) -> Dist:
        """Only the top-k, as an API would report it (for measuring the top-k estimate)."""
        return Dist(dict(self.top))


@dataclass(slots=True)
class Continuation:
    """A greedy continuation of ``prompt``: its tokens, and where the target gives them, the prompt's
    token ids (``vocab`` says whose), the distributions it sampled from, and for each position i
    whether the prompt plus the first i tokens, as text, tokenizes back to the same tokens
    (``canonical``: an API that takes text can only be teacher-forced where it does)."""

    prompt: str
    pieces: list[Piece]
    finish_reason: str | None = None
    prompt_ids: list[int] | None = None
    vocab: Vocab | None = None
    dists: list[Dist | None] | None = None
    canonical: list[bool] | None = None

    @property
    def text(self) -> str:
        return b"".join(p.bytes for p in self.pieces).decode("utf-8", errors="replace")

    @property
    def token_ids(self) -> list[int] | None:
        """Prompt + continuation ids, when the target that generated it gave them."""
        ids = [p.id for p in self.pieces]
        if self.prompt_ids is None or any(i is None for i in ids):
            return None
        return self.prompt_ids + ids  # type: ignore[operator]


@dataclass(slots=True)
class TargetInfo:
    spec: str  # as the user wrote it
    kind: str  # native | llamacpp | openai | ollama
    model: str  # the model name or file it runs
    details: dict = field(default_factory=dict)  # engine settings, API, ...


class Target(Protocol):
    info: TargetInfo
    vocab: Vocab | None  # the whole vocabulary (engines); None for servers

    def generate_greedy(self, prompts: list[str], max_tokens: int, top_k: int,
                        stop: list[str] | None = None) -> list[Continuation]:
        """Greedy continuations, one per prompt (the top-k distributions too, where it is a server)."""
        ...

    def score(self, continuation: Continuation, top_k: int) -> list[Dist | None]:
        """The next-token distribution at each position of ``continuation`` given the tokens before it;
        None at a position the target could not report."""
        ...

    def close(self) -> None: ...

"""What vLLM 0.32 returns for ``logprobs``, ``top_logprobs``, ``echo`` and ``prompt_logprobs``, over the
fake engine's tokens (shapes checked against the real server by tests/remote/test_vllm_conformance.py).

Values are made up but fixed: token ``i`` of a reply has logprob ``-0.25 * (1 + i % 3)``; its
alternatives are the next :data:`~.engine.WORDS`, each 0.5 lower, the token itself first (greedy).

- chat: ``{"content": [{token, logprob, bytes, top_logprobs: [top_logprobs entries]}]}``;
- completions: ``{text_offset, token_logprobs, tokens, top_logprobs}``, each ``top_logprobs`` a
  ``{token: logprob}`` of ``max(logprobs, 1)`` entries; with ``echo`` the prompt's tokens come first, the
  very first with ``null`` logprob and top;
- ``prompt_logprobs``: on the choice, ``null`` then ``{"<id>": {logprob, rank, decoded_token}}`` per prompt token.
"""

from __future__ import annotations

from typing import Any

from .engine import WORDS, FakeEngine, Prompt

PROMPT_ID = 500  # the fake prompt tokens' ids: PROMPT_ID + position


def prompt_tokens(prompt: Prompt) -> list[str]:
    """The prompt's tokens as texts: its words, each after the first with its leading space."""
    words = FakeEngine.render(prompt).split()
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def _value(i: int) -> float:
    return -0.25 * (1 + i % 3)


def _alternatives(token: str, i: int, count: int) -> list[tuple[str, float]]:
    others = [w for w in WORDS if w != token]
    return [(token, _value(i))] + [(others[(i + j) % len(others)], _value(i) - 0.5 * (j + 1)) for j in range(count - 1)]


def chat_entry(token: str, i: int, top: int) -> dict[str, Any]:
    return {"token": token, "logprob": _value(i), "bytes": list(token.encode()),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}
                             for t, lp in _alternatives(token, i, top)][:top]}


def chat_logprobs(tokens: list[str], start: int, top: int) -> dict[str, Any]:
    return {"content": [chat_entry(t, start + i, top) for i, t in enumerate(tokens)]}


def legacy_logprobs(tokens: list[str], start: int, top: int, offset: int, *, echoed: int = 0) -> dict[str, Any]:
    """Completions' lists for ``tokens`` (the reply's from index ``start``); the first ``echoed`` of them are
    the prompt's, and the first of all of those has no logprob."""
    out: dict[str, list] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for i, token in enumerate(tokens):
        first = echoed and i == 0 and start == 0
        out["text_offset"].append(offset)
        out["token_logprobs"].append(None if first else _value(start + i))
        out["tokens"].append(token)
        out["top_logprobs"].append(None if first else dict(_alternatives(token, start + i, max(top, 1))))
        offset += len(token)
    return out


def prompt_logprobs(prompt: Prompt) -> list[dict[str, Any] | None]:
    return [None] + [{str(PROMPT_ID + i): {"logprob": _value(i), "rank": 1, "decoded_token": t}}
                     for i, t in enumerate(prompt_tokens(prompt)) if i > 0]

"""An OpenAI-compatible server's ``logprobs`` as :class:`~core.base.TokenLogprob` entries.

Two wire shapes: a chat choice's ``{"content": [{token, logprob, bytes, top_logprobs: [...]}]}`` and a
legacy completion choice's parallel lists ``{tokens, token_logprobs, top_logprobs: [{token: logprob}],
text_offset}``. Values come as the server sent them: vLLM's ``"bytes:\\xNN"`` token texts for partial
UTF-8, and a ``null`` logprob (the first prompt token with ``echo``) stay as they are.
"""

from __future__ import annotations

from typing import Any

from core.base import TokenLogprob


def wire_logprobs(value: Any) -> list[TokenLogprob]:
    """Either shape; [] for anything else (``null``, an empty object)."""
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("content"), list):
        return [_chat_entry(e) for e in value["content"] if isinstance(e, dict)]
    tokens = value.get("tokens")
    if isinstance(tokens, list):
        return _legacy_entries(tokens, value.get("token_logprobs") or [], value.get("top_logprobs") or [])
    return []


def _chat_entry(entry: dict[str, Any]) -> TokenLogprob:
    top = [_chat_entry(t) for t in entry.get("top_logprobs") or [] if isinstance(t, dict)]
    return TokenLogprob(token=str(entry.get("token", "")), logprob=entry.get("logprob"),  # type: ignore[arg-type]
                        bytes=_bytes(entry), top_logprobs=top)


def _legacy_entries(tokens: list, logprobs: list, tops: list) -> list[TokenLogprob]:
    out = []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        logprob = logprobs[i] if i < len(logprobs) else None
        alternatives = [TokenLogprob(str(t), lp, list(str(t).encode())) for t, lp in top.items()]
        out.append(TokenLogprob(str(token), logprob, list(str(token).encode()), alternatives))  # type: ignore[arg-type]
    return out


def _bytes(entry: dict[str, Any]) -> list[int]:
    raw = entry.get("bytes")
    return list(raw) if isinstance(raw, list) else list(str(entry.get("token", "")).encode())

"""The gateway's own limit on a request's output, enforced on the one event stream every API reads.

A backend is *asked* for at most ``max_tokens``; nothing makes it obey. :class:`OutputCap` holds the
most the gateway lets a request generate, the cap a keyed request's admission computed
(``gateway/policy/admission.py``: the least of its ``max_tokens``, the context left, the key's
``--max-tokens`` and what is left of its budget), and counts the tokens it forwards:

- a piece with token ids counts its ids; a backend that names no ids counts one token a piece (a
  streamed delta is one token, as ``adapters/remote/base.py`` counts them);
- the piece that would pass the cap is cut to what fits, and the request is cancelled
  (``request.cancel``: the backend closes its upstream request and ends with its ``Done``); pieces
  still in flight are dropped;
- the final ``Done`` is the API's ``length`` and never counts more than the cap: a backend that
  reports more output than the cap (a whole non-streamed reply that ignored ``max_tokens``) has that
  reply cut to the cap's share of its text (``trim``, when the reply is collected), and what it
  reported is kept as ``backend_reported`` (the row's ``backend_reported_output_tokens``, an anomaly
  on ``/metrics``), never charged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from core.base import Chunk, Done, GenerationRequest


@dataclass
class OutputCap:
    request: GenerationRequest
    limit: Callable[[], int | None]  # read per piece: a keyed request's cap is known once it is admitted
    forwarded: int = 0
    stopped: bool = False  # the gateway ended the request at its cap
    backend_reported: int | None = None  # the backend's own larger output count, when it reported one
    share: float = 1.0  # of the pieces forwarded, what a reply sent whole keeps (the cap over what was reported)
    _by_ids: bool = False  # the backend names its tokens' ids: pieces without any add none

    def take(self, chunk: Chunk) -> Chunk | None:
        """What of ``chunk`` the client gets (None: nothing); the piece that reaches past the cap stops the request."""
        if self.stopped:
            return None
        tokens = self._tokens(chunk)
        cap = self.limit()
        if cap is None or self.forwarded + tokens <= cap:
            self.forwarded += tokens
            return chunk
        fits = cap - self.forwarded
        self.forwarded, self.stopped = cap, True
        self.request.cancel.cancel()
        return _cut(chunk, fits / tokens) if fits > 0 else None

    def settle(self, done: Done) -> Done:
        """The final record as the gateway answers it: at most the cap, ``length`` when the cap ended it."""
        cap, output = self.limit(), done.usage.output_tokens
        if self.stopped:
            done.finish_reason = "length"
        if cap is None or output <= cap:
            return done
        if done.usage.source != "estimated":
            self.backend_reported = output
        if not self.stopped:
            self.share = cap / output
        done.usage = replace(done.usage, output_tokens=cap,
                             reasoning_tokens=None if done.usage.reasoning_tokens is None
                             else min(done.usage.reasoning_tokens, cap))
        done.finish_reason = "length"
        return done

    def trim(self, pieces: list[Chunk]) -> list[Chunk]:
        """A reply sent whole (not streamed), cut to the cap's share of what the backend reported."""
        return pieces if self.share >= 1.0 else [_cut(piece, self.share) for piece in pieces]

    def _tokens(self, chunk: Chunk) -> int:
        if chunk.token_ids:
            self._by_ids = True
            return len(chunk.token_ids)
        if self._by_ids:
            return 0
        return 1 if chunk.text or chunk.thinking or chunk.tool_calls else 0


def _cut(chunk: Chunk, share: float) -> Chunk:
    """``chunk`` with ``share`` (0-1) of its text, thinking and ids; a tool call cannot be cut, so it is dropped.
    Text is cut before the word the share falls in (no half word: a token ends at most there)."""
    def part(text: str) -> str:
        end = math.floor(len(text) * share)
        if 0 < end < len(text) and not text[end].isspace():
            space = max(text.rfind(" ", 0, end), text.rfind("\n", 0, end))
            end = space if space > 0 else end
        return text[:end]

    ids = chunk.token_ids[:math.floor(len(chunk.token_ids) * share)]
    logprobs = None if chunk.logprobs is None else chunk.logprobs[:len(ids)]
    return Chunk(part(chunk.text), ids, logprobs, [], part(chunk.thinking))

"""Prompt lookup ("n-gram") proposals: no extra model (vLLM's `NgramProposer`, llama.cpp's `--lookup`).

For the longest n in max..min, find the most recent earlier occurrence of the sequence's last n tokens in
its prompt and output, and propose the k tokens that followed it. Input-grounded tasks (summarise, edit,
extract, code changes) copy spans of their input, so the continuation is often right; on open-ended text
a match is rare and usually wrong, which the adaptive controller notices. Torch-free, numpy on the host:
the search is a vectorised compare over the last `max_window` tokens. A match near the end copies on over
its own proposals (a repeating span proposes its next period)."""

from __future__ import annotations

import numpy as np


class NgramProposer:
    def __init__(self, k: int, min_n: int = 1, max_n: int = 3, max_window: int = 4096) -> None:
        self.k, self.min_n, self.max_n, self.max_window = k, min_n, max_n, max_window

    def propose(self, token_ids: list[int], k: int | None = None) -> list[int]:
        """Up to k tokens that followed the latest earlier match of the last n tokens; [] when none."""
        k = self.k if k is None else k
        if k <= 0 or len(token_ids) < self.min_n + 1:
            return []
        window = np.asarray(token_ids[-self.max_window :], dtype=np.int64)
        for n in range(min(self.max_n, len(window) - 1), self.min_n - 1, -1):
            start = _latest_match(window, n)
            if start is not None:
                return _copy_on(window.tolist(), start + n, k)
        return []


def _copy_on(tokens: list[int], source: int, k: int) -> list[int]:
    """k tokens copied from `source` on, as if the copy went on over what it proposes: a match near the end
    (a repeating span) continues its period instead of stopping short."""
    extended = list(tokens)
    for i in range(k):
        extended.append(extended[source + i])
    return extended[len(tokens) :]


def _latest_match(tokens: np.ndarray, n: int) -> int | None:
    """Start of the latest occurrence of tokens[-n:] that ends before the last token and has a follower."""
    suffix = tokens[-n:]
    candidates = len(tokens) - n  # starts 0 .. len - n - 1: each has at least one token after it
    hits = np.ones(candidates, dtype=bool)
    for j in range(n):
        hits &= tokens[j : j + candidates] == suffix[j]
    found = np.flatnonzero(hits)
    return int(found[-1]) if len(found) else None

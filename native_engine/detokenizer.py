"""Incremental detokenization with stop strings (no torch).

Token bytes are joined and released only as whole UTF-8 characters; text that could still
grow into a stop string is held back, so a stream never shows half a stop string and never
splits a character across chunks.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable


class IncrementalDetokenizer:
    def __init__(self, token_bytes: Callable[[int], bytes], stop: list[str] | tuple[str, ...] = ()) -> None:
        self.token_bytes = token_bytes
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""
        self.stop_string: str | None = None

    def add(self, token_id: int) -> str:
        """Feed one token; returns the text that is now safe to show."""
        if not self.stop:  # nothing to hold back: the decoder alone keeps partial characters
            return self._decoder.decode(self.token_bytes(token_id))
        if self.stop_string is not None:
            return ""
        self._held += self._decoder.decode(self.token_bytes(token_id))
        for stop in self.stop:
            index = self._held.find(stop)
            if index >= 0:
                self.stop_string = stop
                text, self._held = self._held[:index], ""
                return text
        keep = self._holdback()
        text = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return text

    def _holdback(self) -> int:
        """Length of the longest tail of the held text that starts some stop string."""
        best = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(self._held)), best, -1):
                if stop.startswith(self._held[-size:]):
                    best = size
                    break
        return best

    def flush(self) -> str:
        """At the end of generation: the held-back text (unless a stop string ended it)."""
        if self.stop_string is not None:
            return ""
        text, self._held = self._held + self._decoder.decode(b"", final=True), ""
        return text

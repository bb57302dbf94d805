"""Token bytes to user-visible text: incremental UTF-8 decoding and stop strings.

Shared by every in-process backend. A token may end in the middle of a UTF-8 character, and a stop
string may span several tokens, so text is held back until it is known not to be the start of one.

    ts = TextStream(stop=["\\nUser:"])
    for piece in token_bytes:
        text = ts.feed(piece)      # safe to show now ("" while undecided)
        if ts.stopped: break
    text += ts.flush()             # end of generation: release what was held back
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    def __init__(self, stop: Sequence[str] = ()):
        self._stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, data: bytes) -> str:
        """Add a token's bytes; return the text that can be emitted now."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        return self._release()

    def flush(self) -> str:
        """End of generation: emit everything still held back (minus a matched stop)."""
        if not self.stopped:
            self._pending += self._decoder.decode(b"", final=True)
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _release(self) -> str:
        hit = self._first_stop()
        if hit is not None:
            self.stopped = True
            self.matched = min((s for s in self._stop if self._pending.find(s) == hit), key=len)
            out, self._pending = self._pending[:hit], ""
            return out
        keep = self._partial_stop_len()
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def _first_stop(self) -> int | None:
        positions = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        return min(positions) if positions else None

    def _partial_stop_len(self) -> int:
        """Longest suffix of the pending text that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:n]):
                    best = n
                    break
        return best

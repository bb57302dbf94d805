"""Progress events for pull, push and create, in the shape of Ollama's NDJSON status lines.

The CLI renders them with rich; ``/api/pull`` streams ``event.wire()`` as NDJSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgressEvent:
    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None

    def wire(self) -> dict:
        """``completed`` is omitted while 0, like Ollama's Go encoder."""
        out: dict = {"status": self.status}
        if self.digest is not None:
            out["digest"] = self.digest
        if self.total is not None:
            out["total"] = self.total
        if self.completed:
            out["completed"] = self.completed
        return out


ProgressCallback = Callable[[ProgressEvent], None]


def ignore(_: ProgressEvent) -> None:
    return None

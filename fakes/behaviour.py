"""What a test asks a fake server to do next, and what the server saw.

Tests mutate one :class:`Behaviour` between requests (the server thread reads it per request):

    server.behaviour.fail_status = 429; server.behaviour.retry_after = "3"
    server.behaviour.drop_after = 2            # two tokens, then the connection is cut

Faults, in the order a request meets them:
- ``fail_status``: the next ``fail_times`` generation requests get this status in the backend's own
  error body for that class (see each server's ``error_body``), then it clears itself;
- ``ignore_max_tokens`` = N: every request generates N tokens whatever its ``max_tokens`` says (and
  reports them in its usage), as a misbehaving server does (vLLM's fake);
- ``first_byte_delay``: seconds before the status line (nothing at all is sent meanwhile);
- ``token_delay``: seconds before each token event;
- ``fail_after`` / ``drop_after`` / ``malformed_after`` = N: after N token events (or after all of them
  when N is larger) the stream gets the backend's own error event inside the 200 / is cut without
  finishing / gets a non-JSON event. These stay set until :meth:`reset`. On a non-streaming request
  ``fail_after`` becomes an error status, ``drop_after`` cuts the body halfway, ``malformed_after``
  returns a non-JSON 200 body.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Behaviour:
    fail_status: int | None = None
    fail_message: str = "simulated failure"
    fail_times: int = 1                      # how many requests fail_status answers before clearing
    retry_after: str | None = None           # Retry-After header on 429/503 answers
    fail_after: int | None = None
    drop_after: int | None = None
    malformed_after: int | None = None
    first_byte_delay: float = 0.0
    token_delay: float = 0.0
    report_usage: bool = True                # False: no usage chunk / details / num_*_tokens outputs
    ignore_max_tokens: int | None = None     # a backend that ignores max_tokens: generates this many tokens
    healthy: bool = True
    models: list[str] = field(default_factory=list)   # served model names; start_server fills it
    parents: dict[str, str] = field(default_factory=dict)  # a LoRA adapter's name -> its base (vLLM's parent)
    running: int = 0                         # load figures for /metrics
    waiting: int = 0
    kv_usage: float = 0.0                    # 0..1
    requests: list[dict[str, Any]] = field(default_factory=list)  # bodies seen, plus "path", "headers"
    disconnects: int = 0                     # clients that left before a response was finished

    def reset(self) -> None:
        """Every field back to its default except ``models`` and ``parents``."""
        models, parents = self.models, self.parents
        for f in fields(self):
            setattr(self, f.name, f.default_factory() if callable(f.default_factory) else f.default)
        self.models, self.parents = models, parents

    def wait_for(self, predicate: Callable[[Behaviour], bool], timeout: float = 2.0) -> bool:
        """Poll until ``predicate(self)`` holds (the server notices a disconnect asynchronously)."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def take_failure(self) -> int | None:
        """The status to answer this request with, counting it against ``fail_times``."""
        status = self.fail_status
        if status is not None:
            self.fail_times -= 1
            if self.fail_times <= 0:
                self.fail_status, self.fail_times = None, 1
        return status

    def stream_fault(self, sent: int, total: int) -> str | None:
        """``"fail"``, ``"drop"`` or ``"malformed"`` when due after ``sent`` of ``total`` token events."""
        for kind in ("fail", "drop", "malformed"):
            after = getattr(self, f"{kind}_after")
            if after is not None and sent == min(after, total):
                return kind
        return None

    def body_fault(self) -> str | None:
        """The fault a non-streaming request meets, if any."""
        return next((k for k in ("fail", "drop", "malformed") if getattr(self, f"{k}_after") is not None), None)

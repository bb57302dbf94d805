"""A keyed request's admission: its key's per-minute limits and budget, decided before it runs.

The recorder makes one :class:`Admission` per request sent with a ledger key (``sk-infer-…``):

1. :meth:`Admission.start` on arrival: the key's requests per minute (``gateway/policy/ratelimit.py``).
2. :meth:`Admission.admit`, once the prompt's tokens are counted and before the backend generates
   anything: the in-process engines call it (``request.admit``) with the tokenizer's count and the
   context; a remote adapter with an upper bound of its prompt (``frontend/token_count.py``) and its
   configured ``context_length``; any other backend is admitted by the recorder before it starts.
   The most the request may generate is the least of its ``max_tokens``/``num_predict``, the
   context less the prompt and the key's ``max_output_tokens``; when none is known and the key has
   a budget or a token limit, ``DEFAULT_OUTPUT_CAP``. Its tokens are charged to the key's tokens
   per minute and its cost at that maximum is held on the key's budget; when the budget has less
   left, the request is admitted with what is left and stops there (``finish_reason: "length"``,
   and the response's ``x-infer-note`` header says why). The answer is the number of tokens the
   backend may generate (None: no bound), which it enforces.
3. :meth:`Admission.finish` when the request ends: the hold becomes the actual cost, and the
   request's entry in the tokens-per-minute window its actual tokens.

A refused request (429, or 503 when the database or Redis is down) never reaches generation and
costs nothing.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from pricing.book import PriceBook
from pricing.method import Tokens

from gateway.policy.keys import Claim, KeyBook, OverBudget

DEFAULT_OUTPUT_CAP = 4096  # tokens, when a budget or token limit needs a bound and nothing else gives one

Rates = tuple[float, float]  # dollars per input token, per output token


@dataclass
class Admission:
    book: KeyBook
    key: Any  # ledger.keys.ApiKey
    request: Any  # adapters.base.GenerationRequest
    prices: PriceBook | None = None
    names: tuple[str, ...] = ()  # what the request's cost is priced under (the backend, the model)
    request_id: str = field(default_factory=lambda: secrets.token_hex(8))
    claim: Claim | None = None
    cap: int | None = None
    note: str | None = None
    _answer: tuple[bool, Any] | None = None  # (admitted, the cap or the refusal), once decided
    _started = False

    @property
    def limited(self) -> bool:
        return self.key.rpm is not None or self.key.tpm is not None

    def rates(self, served_by: str | None) -> Rates | None:
        """What an input and an output token cost on the backend that serves the request (it names
        itself when it admits: a route's member), None when it is not priced."""
        prices, names = self.prices, (*([served_by] if served_by else []), *self.names)
        if prices is None:
            return None
        per_input = prices.estimate(names, Tokens(1_000_000, 0, 0)) / 1_000_000
        per_output = prices.estimate(names, Tokens(0, 0, 1_000_000)) / 1_000_000
        return (per_input, per_output) if per_input or per_output else None

    async def start(self) -> None:
        if self.limited:
            await self.book.windows.start(self.key, self.request_id)
            self._started = True

    async def admit(self, prompt_tokens: int, context: int | None, served_by: str | None = None) -> int | None:
        """The most tokens the request may generate, or OverBudget/RateLimited; once per request (a
        route trying a second member gets the first answer)."""
        if self._answer is None:
            try:
                self._answer = (True, await self._admit(prompt_tokens, context, self.rates(served_by)))
            except Exception as exc:
                self._answer = (False, exc)
        admitted, answer = self._answer
        if not admitted:
            raise answer
        return answer

    async def _admit(self, prompt: int, context: int | None, rates: Rates | None) -> int | None:
        asked = int(self.request.options.get("num_predict") or 0)
        asked = asked if asked > 0 else None
        budgeted = self.key.budget_usd is not None and rates is not None
        most, why = self._bound(asked, prompt, context, budgeted)
        if self.key.tpm is not None:
            await self.book.windows.charge(self.key, self.request_id, prompt + (most or 0))
        if budgeted:
            most, why = await self._hold(prompt, most, why, rates)
        self.cap = most
        if why is not None and most is not None and (asked is None or most < asked):
            self.note = f"output limited to {most} tokens: {why}"
        return most

    def _bound(self, asked: int | None, prompt: int, context: int | None,
               budgeted: bool) -> tuple[int | None, str | None]:
        bounds = [(asked, None), (context - prompt if context else None, None),
                  (self.key.max_output_tokens, f"key '{self.key.name}' allows at most that many a request")]
        found = [(n, why) for n, why in bounds if n is not None]
        if found:
            most, why = min(found, key=lambda pair: pair[0])
            return max(1, most), why
        if budgeted or self.key.tpm is not None:
            return DEFAULT_OUTPUT_CAP, ("no max_tokens was given and the backend's context is unknown; key "
                                        f"'{self.key.name}' has a budget or token limit, which needs a bound")
        return None, None

    async def _hold(self, prompt: int, most: int | None, why: str | None,
                    rates: Rates) -> tuple[int | None, str | None]:
        assert most is not None
        base, per_token = prompt * rates[0], rates[1]
        wanted, minimum = base + per_token * most, base + per_token
        claim = await self.book.hold(self.key, wanted, minimum)
        if claim is None:
            raise OverBudget(f"key '{self.key.name}' is over budget: what is left of its ${self.key.budget_usd:.6f} "
                             f"budget, less what requests in flight hold, cannot cover this request's prompt and "
                             f"one token (${minimum:.6f})", retry_after=60.0)
        self.claim = claim
        if claim.taken + 1e-12 >= wanted or per_token <= 0:
            return most, why
        fits = max(1, math.floor((claim.taken - base) / per_token + 1e-9))
        return min(most, fits), f"that is what is left of the budget of key '{self.key.name}'"

    def finish(self, input_tokens: int, output_tokens: int, cost: float, writer) -> list:
        """The request ended: its hold settles to ``cost`` (queued on ``writer``, the ledger writer,
        or returned as work to run), its tokens-per-minute entry keeps its actual tokens. Returns the
        coroutines still to run."""
        work: list = []
        if self.claim is not None:
            claim, self.claim = self.claim, None
            hold = claim.hold
            if writer is not None:
                writer.settle(hold.key_name, hold.id, claim.taken, cost, hold.period_start)
            else:
                from ledger.keys import settle

                work.append(asyncio.to_thread(settle, self.book.db, hold.key_name, hold.id, claim.taken, cost,
                                              hold.period_start))
            self.book.released(claim)
        if self._started and self.key.tpm is not None:
            work.append(self.book.windows.settle(self.key, self.request_id, input_tokens + output_tokens))
        return work

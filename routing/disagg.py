"""Prefill/decode disaggregation, orchestrated by a route: a long prompt is prefilled on one worker
and decoded on another, so it does not stall the streams decoding there.

    routes:
      - name: chat
        backends: [d1]                         # co-located: where the rest goes
        prefill: {protocol: vllm, backends: [p1]}
        decode: {protocol: vllm, backends: [d1]}
        disagg: {when: slo, threshold_tokens: 512}

**The decision** (``Disaggregation.plan``), per request: ``when: always`` disaggregates every request;
``long`` the requests whose uncached prompt on the decode worker (the route's prefix index) is over
``threshold_tokens`` (llm-d's rule); ``slo`` (the default) those of them whose prefill, run co-located,
would push the decode worker's predicted TPOT past the route's TPOT SLO
(``LatencyModel.worst_tpot_with``, with the dispatcher's margin) while the prefill worker's own
streams, if it has any (a worker of the route's ``backends`` too), would keep theirs: a prefill that
breaks the TPOT on both workers is not moved, only served co-located. The rest is served co-located.

**The protocols**, from their sources:

- ``vllm`` (the KV connectors, ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``): the
  prefill leg is the client's body with ``max_tokens: 1`` (and ``max_completion_tokens: 1`` when set),
  ``stream: false``, no ``stream_options`` / ``min_tokens`` / ``min_completion_tokens``, and
  ``kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false, remote_*: null}``; the
  decode leg is the client's body plus the ``kv_transfer_params`` the prefill answered; both carry
  the same ``X-Request-Id``; a prefill answer without ``kv_transfer_params`` (a connector that moves
  the KV by other means, such as the shared-storage ``ExampleConnector``) sends the decode leg the
  client's body as it is;
- ``sglang`` (``sglang_router/mini_lb.py``): both legs get the client's body plus ``bootstrap_host``
  (the prefill server's host), ``bootstrap_port`` and a random 63-bit ``bootstrap_room``, at once;
  the client gets decode's answer.

**One request**: both legs share one request id and one cancel token (the client leaving, a leg
failing or a timeout stops both); the prefill leg has ``prefill_timeout_ms``, the decode leg its
backend's timeouts. A prefill leg that fails (an error, a timeout) before decode sent anything
raises :class:`PrefillFailed`, and the route serves the request co-located. Usage is counted once, from the decode leg (which reports the
prompt too); its cached prompt tokens are those the prefill worker reported, since the prompt was
computed there. The final Done names both workers (``served_by``, ``prefill_by``) and the prefill
leg's time (``prefill_s``); the ledger prices the prompt at the prefill worker's rates and the
output at the decode worker's.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from core.base import CancelToken, Done, GenerationRequest, StreamEvent, Timings, Usage
from core.errors import BackendError

from .dispatch import TPOT_QUANTILE
from .slo import SLO
from .strategies import Member

log = logging.getLogger(__name__)
UNSUPPORTED_BY_PREFILL = ("stream_options", "min_tokens", "min_completion_tokens")


@dataclass(frozen=True)
class DisaggPolicy:
    """The config's ``PoolEntry`` and ``DisaggEntry`` (``routing.build.disagg_policy``)."""

    protocol: str           # "vllm" or "sglang"
    when: str               # "always" | "long" | "slo"
    threshold_tokens: int
    prefill_timeout_s: float
    bootstrap_port: int     # sglang: the prefill servers' --disaggregation-bootstrap-port


class PrefillFailed(Exception):
    """The prefill leg failed before decode sent anything: the route serves the request co-located."""


DecodeLeg = Callable[[Member, GenerationRequest], AsyncIterator[StreamEvent]]


class Disaggregation:
    """A route's prefill and decode pools (members shared with the route, so one latency model each)."""

    def __init__(self, prefill: list[Member], decode: list[Member], policy: DisaggPolicy):
        self.prefill, self.decode, self.policy = prefill, decode, policy
        self.counts = {"disaggregated": 0, "colocated": 0, "prefill_failed": 0}

    def plan(self, prompt_tokens: int, cached: dict[str, int], slo: SLO) -> tuple[Member, Member] | None:
        """The (prefill, decode) pair to serve this request disaggregated, or None: co-located."""
        prefill = [m for m in self.prefill if m.breaker.allows()]
        decode = [m for m in self.decode if m.breaker.allows()]
        pair = None
        if prefill and decode:
            d = max(decode, key=lambda m: (cached.get(m.name, 0), -m.in_flight))
            if self._worth_it(d, prompt_tokens, cached.get(d.name, 0), slo):
                p = self._prefill_worker(prefill, prompt_tokens, cached)
                pair = (p, d) if self._absorbs(p, prompt_tokens, cached.get(p.name, 0), slo) else None
        self.counts["disaggregated" if pair else "colocated"] += 1
        return pair

    @staticmethod
    def _prefill_worker(prefill: list[Member], prompt_tokens: int, cached: dict[str, int]) -> Member:
        """The prefill worker predicted to answer first (one alone needs no prediction: a refit costs)."""
        if len(prefill) == 1:
            return prefill[0]
        return min(prefill, key=lambda m: (m.latency.predict(prompt_tokens, cached.get(m.name, 0)).ttft_s,
                                           m.in_flight))

    def _worth_it(self, decode: Member, prompt_tokens: int, cached: int, slo: SLO) -> bool:
        when = self.policy.when
        if when == "always":
            return True
        if prompt_tokens - min(cached, prompt_tokens) <= self.policy.threshold_tokens:
            return False
        return when == "long" or slo.tpot_ms is None or _breaks_tpot(decode, prompt_tokens, cached, slo)

    def _absorbs(self, prefill: Member, prompt_tokens: int, cached: int, slo: SLO) -> bool:
        """``when: slo``: the prefill worker's own streams (a worker of both pools, or of the route's
        ``backends`` too) keep their TPOT with this prefill; else disaggregating only moves the stall."""
        if self.policy.when != "slo" or slo.tpot_ms is None:
            return True
        return not _breaks_tpot(prefill, prompt_tokens, cached, slo)

    async def stream(self, request: GenerationRequest, pair: tuple[Member, Member], prompt_tokens: int,
                     cached: dict[str, int], decode_leg: DecodeLeg) -> AsyncIterator[StreamEvent]:
        """Both legs of ``request`` on ``pair``; ``decode_leg(member, leg_request)`` runs the decode
        leg as the route runs any attempt (its latency model, breaker, window and Done annotations)."""
        prefill, decode = pair
        legs = CancelToken()  # the client leaving, or a failed leg, stops both
        request.cancel.on_cancel(legs.cancel)
        base = replace(request, request_id=request.request_id or uuid.uuid4().hex, cancel=legs, stream=True)
        admit = getattr(decode.backend, "admit_request", None)
        if base.admit is not None and admit is not None:  # once, before either leg costs anything
            await admit(base)
            base.admit = None
        leg = _PrefillLeg(prefill, self.policy.prefill_timeout_s, prompt_tokens, cached.get(prefill.name, 0))
        run = self._vllm if self.policy.protocol == "vllm" else self._sglang
        try:
            async for event in run(base, leg, decode, decode_leg):
                yield event
        except PrefillFailed:
            self.counts["prefill_failed"] += 1
            raise

    # -- vLLM: prefill, then decode with the prefill's kv_transfer_params ---------------------------

    async def _vllm(self, request: GenerationRequest, leg: "_PrefillLeg", decode: Member,
                    decode_leg: DecodeLeg) -> AsyncIterator[StreamEvent]:
        warm = lambda: decode.latency.predict(leg.prompt_tokens, leg.prompt_tokens)  # noqa: E731
        reply = await leg.run(request, _vllm_prefill(leg.member, request), warm)
        if reply is None:  # the client left during the prefill
            yield leg.cancelled_done(request)
            return
        params = reply.get("kv_transfer_params") if isinstance(reply, dict) else None
        leg.member.breaker.succeeded()
        fields = {"kv_transfer_params": params} if isinstance(params, dict) else None  # the toy proxy's rule
        async for event in decode_leg(decode, replace(request, disagg_fields=fields)):
            if isinstance(event, Done):
                _annotate(event, leg, _reported_cached(reply))
            yield event

    # -- SGLang: both legs at once, with the bootstrap fields ----------------------------------------

    async def _sglang(self, request: GenerationRequest, leg: "_PrefillLeg", decode: Member,
                      decode_leg: DecodeLeg) -> AsyncIterator[StreamEvent]:
        fields = {"bootstrap_host": _host_of(leg.member.backend), "bootstrap_port": self.policy.bootstrap_port,
                  "bootstrap_room": random.getrandbits(63)}
        both = replace(request, disagg_fields=fields)
        task = asyncio.ensure_future(leg.run(both, _drain(leg.member, both)))
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or request.cancel.cancel())
        sent = False
        try:
            async for event in decode_leg(decode, both):
                if isinstance(event, Done):
                    if not sent and _failure(task) is not None:
                        raise _failure(task)  # the prefill failed first: decode was stopped for it
                    if task.done() and not task.cancelled():
                        leg.member.breaker.succeeded()
                    _annotate(event, leg, task.result() if task.done() and not task.cancelled() else None)
                else:
                    sent = True
                yield event
        except BackendError as exc:
            if not sent and _failure(task) is not None:
                raise _failure(task) from exc  # decode gave up waiting for a prefill that failed
            raise
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _breaks_tpot(member: Member, prompt_tokens: int, cached: int, slo: SLO) -> bool:
    """Prefilling this prompt on ``member`` would push a request in flight there past the TPOT SLO
    (``LatencyModel.worst_tpot_with``, with the dispatcher's margin)."""
    latency = member.latency
    worst = latency.worst_tpot_with(prompt_tokens, cached) * latency.ratio("tpot", TPOT_QUANTILE)
    return worst * 1000 > slo.tpot_ms


class _PrefillLeg:
    """The prefill leg's bookkeeping on its member: latency model, breaker, timeout, failure."""

    def __init__(self, member: Member, timeout_s: float, prompt_tokens: int, cached: int):
        self.member, self.timeout_s = member, timeout_s
        self.prompt_tokens, self.cached = prompt_tokens, cached
        self.took: float | None = None

    async def run(self, request: GenerationRequest, call: Awaitable[Any], warm: Callable[[], Any] | None = None) -> Any:
        """The leg's answer; None when the client left; PrefillFailed on an error or the timeout. The
        bookkeeping runs once the leg is on the wire (a predictor's refit costs a few tenths of a ms), and so
        does ``warm`` (the decode worker's refit, before its leg needs it)."""
        latency, key = self.member.latency, id(self)
        t0 = time.perf_counter()
        task = asyncio.ensure_future(call)
        request.cancel.on_cancel(task.cancel)
        try:
            await asyncio.sleep(0)  # the request goes out
            features, _ = latency.started(key, self.prompt_tokens, 1, self.cached)
            self.member.breaker.attempt()
            if warm is not None:
                warm()
            async with asyncio.timeout(self.timeout_s):
                answer = await task
        except asyncio.CancelledError:
            latency.finished(key)
            if not request.cancel.cancelled:
                task.cancel()
                raise
            return None
        except (TimeoutError, BackendError) as exc:
            latency.finished(key)
            why = exc.message if isinstance(exc, BackendError) else f"no answer within {self.timeout_s:g} s"
            self.failed(f"{self.member.name}: {why}")
        self.took = time.perf_counter() - t0
        latency.first_token(key, features)
        latency.finished(key)
        return answer

    def failed(self, why: str) -> None:
        self.member.breaker.failed()
        log.warning("prefill leg failed, serving co-located: %s", why)
        raise PrefillFailed(why)

    def cancelled_done(self, request: GenerationRequest) -> Done:
        done = Done("cancelled", Usage(), Timings(total=time.perf_counter() - request.arrival))
        return _annotate(done, self, None)


async def _vllm_prefill(member: Member, request: GenerationRequest) -> Any:
    """vLLM's prefill leg: the client's body for one token, asking the server to keep the KV for a decode."""
    backend = member.backend
    path, body = backend.body(replace(request, model=member.model), stream=False)
    body.update(stream=False, max_tokens=1, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None})
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    for name in UNSUPPORTED_BY_PREFILL:
        body.pop(name, None)
    return await backend.post_json(path, body, request.request_id)


async def _drain(member: Member, request: GenerationRequest) -> int | None:
    """SGLang's prefill leg: its answer read to the end; the prompt tokens it found cached."""
    cached = None
    async for event in member.backend.stream(replace(request, model=member.model)):
        if isinstance(event, Done):
            cached = event.usage.cached_input_tokens
    return cached


def _failure(task: asyncio.Future) -> BaseException | None:
    return task.exception() if task.done() and not task.cancelled() else None


def _reported_cached(reply: Any) -> int | None:
    usage = reply.get("usage") if isinstance(reply, dict) else None
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    return int(cached) if isinstance(cached, int) else None


def _annotate(done: Done, leg: _PrefillLeg, cached: int | None) -> Done:
    """The decode leg's Done, naming the prefill worker; its cached prompt tokens are the prefill's."""
    done.prefill_by, done.prefill_s = leg.member.name, leg.took
    done.usage.cached_input_tokens = cached
    return done


def _host_of(backend: Any) -> str:
    settings = getattr(backend, "settings", None)
    return urlsplit(getattr(settings, "base_url", "")).hostname or "127.0.0.1"

"""Routes from the config file's ``routes:`` entries, over the backends the router already has.

The runtime policies (``RoutePolicy``, ``SLO``, ``PrefixPolicy``, ``DisaggPolicy``) have no defaults of
their own: each is made here from its entry (``gateway/backends_config.py``), where every default is
written once. ``entries`` are ``RouteEntry`` objects, read by attribute (routing does not import the
gateway).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.base import Backend

from .disagg import DisaggPolicy
from .kv_events import KVEventSource
from .prefix import PrefixPolicy
from .route import Route, RoutePolicy
from .slo import SLO
from .strategies import Member


def build_routes(entries: list, remote: dict[str, Backend], local: Callable[[str], Backend],
                 kv_sources: dict[str, KVEventSource] | None = None) -> dict[str, Route]:
    """A member named in ``remote`` is that backend, any other name a model of the local store served by
    ``local(name)``. ``kv_sources``: the backends that publish their KV cache, by name (one stream each,
    shared by the routes)."""
    kv_sources = kv_sources or {}
    routes: dict[str, Route] = {}
    for entry in entries:
        members = {name: Member(name=name, backend=remote[name] if name in remote else local(name), model=name,
                                weight=entry.weights.get(name, 1.0)) for name in entry.members}
        pools = {pool: [members[n] for n in getattr(entry, pool).backends] if getattr(entry, pool) else None
                 for pool in ("prefill", "decode")}
        routes[entry.name] = Route(entry.name, [members[n] for n in entry.backends], route_policy(entry),
                                   resolve_route=routes.get,
                                   kv_sources={n: kv_sources[n] for n in entry.members if n in kv_sources}, **pools)
    return routes


def route_policy(entry: Any) -> RoutePolicy:
    """A ``RouteEntry``'s policies."""
    timeout_ms = entry.first_token_timeout_ms
    return RoutePolicy(strategy=entry.strategy, slo=slo_policy(entry.slo), shed=entry.shed, first_token_timeout_s=timeout_ms / 1000 if timeout_ms else None,
                       retries=entry.retries, fallbacks=tuple(entry.fallbacks), prefix=prefix_policy(entry.prefix),
                       disagg=disagg_policy(entry) if entry.prefill is not None else None)


def slo_policy(entry: Any) -> SLO:
    """An ``SLOEntry``'s SLO."""
    return SLO(ttft_ms=entry.ttft_ms, tpot_ms=entry.tpot_ms, e2e_ms=entry.e2e_ms, target=entry.target,
               window_s=entry.window_s)


def prefix_policy(entry: Any) -> PrefixPolicy:
    """A ``PrefixEntry``'s index policy."""
    return PrefixPolicy(block_chars=entry.block_chars, max_blocks=entry.max_blocks,
                        capacity_tokens=entry.capacity_tokens, load_factor=entry.load_factor,
                        load_slack=entry.load_slack, min_match=entry.min_match)


def disagg_policy(entry: Any) -> DisaggPolicy:
    """A ``RouteEntry`` with prefill and decode pools: when and how it disaggregates."""
    d = entry.disagg
    return DisaggPolicy(protocol=entry.prefill.protocol, when=d.when, threshold_tokens=d.threshold_tokens,
                        prefill_timeout_s=d.prefill_timeout_ms / 1000, bootstrap_port=entry.prefill.bootstrap_port)

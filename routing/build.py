"""Routes from the config file's ``routes:`` entries, over the backends the router already has."""

from __future__ import annotations

from collections.abc import Callable

from core.base import Backend

from .disagg import DisaggPolicy
from .kv_events import KVEventSource
from .prefix import PrefixPolicy
from .route import Route, RoutePolicy
from .slo import SLO
from .strategies import Member


def build_routes(entries: list, remote: dict[str, Backend], local: Callable[[str], Backend],
                 kv_sources: dict[str, KVEventSource] | None = None) -> dict[str, Route]:
    """``entries``: ``gateway.backends_config.RouteEntry``; a member named in ``remote`` is that
    backend, any other name a model of the local store served by ``local(name)``. ``kv_sources``:
    the backends that publish their KV cache, by name (one stream each, shared by the routes)."""
    kv_sources = kv_sources or {}
    routes: dict[str, Route] = {}
    for entry in entries:
        members = {name: Member(name=name, backend=remote[name] if name in remote else local(name), model=name,
                                weight=entry.weights.get(name, 1.0)) for name in entry.members}
        slo = SLO(**entry.slo.model_dump()) if entry.slo is not None else SLO()
        policy = RoutePolicy(strategy=entry.strategy, slo=slo, shed=entry.shed, retries=entry.retries,
                             first_token_timeout_s=(entry.first_token_timeout_ms / 1000
                                                    if entry.first_token_timeout_ms else None),
                             fallbacks=tuple(entry.fallbacks), prefix=PrefixPolicy(**entry.prefix.model_dump()),
                             disagg=_disagg_policy(entry))
        pools = {pool: [members[n] for n in getattr(entry, pool).backends] if getattr(entry, pool) else None
                 for pool in ("prefill", "decode")}
        routes[entry.name] = Route(entry.name, [members[n] for n in entry.backends], policy, resolve_route=routes.get,
                                   kv_sources={n: kv_sources[n] for n in entry.members if n in kv_sources}, **pools)
    return routes


def _disagg_policy(entry) -> DisaggPolicy:
    if entry.prefill is None:
        return DisaggPolicy()
    d = entry.disagg
    return DisaggPolicy(protocol=entry.prefill.protocol, when=d.when, threshold_tokens=d.threshold_tokens,
                        prefill_timeout_s=d.prefill_timeout_ms / 1000, bootstrap_port=entry.prefill.bootstrap_port)

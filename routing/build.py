"""Routes from the config file's ``routes:`` entries, over the backends the router already has."""

from __future__ import annotations

from collections.abc import Callable

from adapters.core.base import Backend

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
        members = [Member(name=name, backend=remote[name] if name in remote else local(name), model=name,
                          weight=entry.weights.get(name, 1.0)) for name in entry.backends]
        slo = SLO(**entry.slo.model_dump()) if entry.slo is not None else SLO()
        policy = RoutePolicy(strategy=entry.strategy, slo=slo, shed=entry.shed, retries=entry.retries,
                             first_token_timeout_s=(entry.first_token_timeout_ms / 1000
                                                    if entry.first_token_timeout_ms else None),
                             fallbacks=tuple(entry.fallbacks), prefix=PrefixPolicy(**entry.prefix.model_dump()))
        routes[entry.name] = Route(entry.name, members, policy, resolve_route=routes.get,
                                   kv_sources={n: kv_sources[n] for n in entry.backends if n in kv_sources})
    return routes

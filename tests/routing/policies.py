"""Runtime policies for tests, made as ``infer serve`` makes them: from config entries, whose
defaults are the only ones (``routing.build``)."""

from __future__ import annotations

from gateway.backends_config import PrefixEntry, RouteEntry, SLOEntry
from routing.build import prefix_policy, route_policy, slo_policy
from routing.prefix import PrefixPolicy
from routing.route import RoutePolicy
from routing.slo import SLO


def slo(**fields) -> SLO:
    return slo_policy(SLOEntry(**fields))


def prefix(**fields) -> PrefixPolicy:
    return prefix_policy(PrefixEntry(**fields))


def policy(**fields) -> RoutePolicy:
    return route_policy(RouteEntry(name="route", **fields))

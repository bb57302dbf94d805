"""The prefix index and the ``prefix`` strategy: longest match, chained keys, LRU within capacity
(tails first), bounded loads, and what the route's ``slo`` dispatcher makes of expected cached tokens."""

from __future__ import annotations

from core.base import GenerationRequest
from routing.dispatch import Dispatcher, Waiter
from routing.predictor import LatencyModel
from routing.prefix import PrefixIndex, RoutePrefixes, block_keys, choose, expected_cached, prompt_text
from tests.routing.policies import prefix as PrefixPolicy, slo as SLO
from routing.strategies import Member, Orderer

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}  # 1,160 characters


def chat(*turns: str) -> GenerationRequest:
    messages = [SYSTEM] + [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return GenerationRequest(model="route", messages=messages)


def test_the_keys_chain_so_a_key_stands_for_the_whole_prefix():
    a = block_keys("x" * 128 + "y" * 128, "route", 128, 512)
    b = block_keys("z" * 128 + "y" * 128, "route", 128, 512)
    assert len(a) == 2 and a[1] != b[1]                      # same second block, different prefix
    assert block_keys("x" * 300, "route", 128, 512) == block_keys("x" * 256, "route", 128, 512)  # no partial block
    assert block_keys("x" * 128 * 10, "route", 128, 4) == block_keys("x" * 128 * 4, "route", 128, 4)
    assert block_keys("x" * 128, "other route", 128, 512) != block_keys("x" * 128, "route", 128, 512)


def test_a_chat_renders_so_a_later_turn_extends_the_earlier_one():
    first, later = prompt_text(chat("hello")), prompt_text(chat("hello", "hi there", "and now?"))
    assert later.startswith(first)
    parts = GenerationRequest(model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                 {"type": "text", "text": "b"}]}])
    assert prompt_text(parts) == "user\x1fab\x1e"
    assert prompt_text(GenerationRequest(model="m", prompt="go", system="sys")) == "sys\x1ego"


def test_match_counts_each_backends_leading_blocks():
    index = PrefixIndex(3, PrefixPolicy())
    keys = [11, 12, 13, 14]
    index.insert(0, keys[:2])
    index.insert(2, keys)
    assert index.match(keys) == [2, 0, 4]
    assert index.match([99] + keys) == [0, 0, 0]


def test_eviction_takes_the_least_recently_sent_tails_first_and_follows_capacity():
    index = PrefixIndex(1, PrefixPolicy(block_chars=128))
    index.set_capacity(0, 5 * 32)  # 5 blocks of 128 characters at 4 characters a token
    shared = [1, 2, 3]
    index.insert(0, shared + [10, 11])   # conversation A: system prompt blocks 1-3, its own 10-11
    index.insert(0, shared + [20])       # conversation B: evicts A's tail (11), never the shared head
    assert index.size(0) == 5 and index.match(shared + [10, 11]) == [4]
    assert index.match(shared + [20]) == [4] and index.evicted == [1]
    index.set_capacity(0, 2 * 32)
    assert index.match(shared) == [2]    # the head is what stays
    index.clear(0)
    assert index.size(0) == 0 and index.owners == {}


def test_bounded_loads_keep_a_hot_prefix_from_pinning_one_backend():
    policy = PrefixPolicy(load_factor=1.25, load_slack=0)
    # backend 0 holds the prefix; 4 in flight there, 1 and 1 elsewhere: ceil(1.25 * 7 / 3) = 3 < 5
    assert choose([8, 0, 0], [4, 1, 1], [10, 0, 5], [0, 1, 2], 8, policy) == 1  # least loaded, then most room
    assert choose([8, 0, 0], [2, 1, 1], [10, 0, 5], [0, 1, 2], 8, policy) == 0  # within the bound: the match
    assert choose([8, 6, 0], [4, 1, 1], [10, 0, 5], [0, 1, 2], 8, policy) == 1  # next-longest within the bound
    assert choose([1, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 2], 8, PrefixPolicy(min_match=0.5)) == 0  # too short: least
    assert choose([0, 0, 0], [0, 0, 0], [9, 3, 0], [0, 1, 2], 8, policy) == 2
    assert choose([8, 0, 0], [4, 1, 1], [10, 0, 5], [0, 1, 2], 8, PrefixPolicy(load_slack=2)) == 0  # 5 <= 3 + 2


def test_the_route_sends_a_conversation_back_where_its_prefix_is():
    members = [Member(name=n, backend=None, model="m") for n in ("a", "b", "c")]
    prefixes = RoutePrefixes("route", ["a", "b", "c"], PrefixPolicy())
    order = Orderer("prefix")
    served = []
    for turns in (("hello",), ("hello", "hi", "more"), ("hello", "hi", "more", "ok", "last")):
        lookup = prefixes.lookup(chat(*turns), prompt_tokens=400)
        first = prefixes.pick(lookup, members)
        chosen = order.order(members, {}, SLO(), 16, first)[0]
        prefixes.sent(chosen.name, lookup)
        served.append((chosen.name, lookup.cached.get(chosen.name, 0)))
    assert [name for name, _ in served] == ["a", "a", "a"]
    assert served[0][1] == 0 and served[1][1] > 300 and served[2][1] > served[1][1] * 0.8
    other = prefixes.lookup(GenerationRequest(model="m", messages=[{"role": "user", "content": "z" * 600}]), 150)
    assert other.cached == {} and prefixes.pick(other, members).name == "b"  # no match: the most room
    prefixes.served("a", lookup, 400, 380)
    assert prefixes.view("a")["cache_hit_ratio"] == 0.95 and prefixes.view("a")["prefix_blocks"] > 0
    assert prefixes.index.chars_per_token == lookup.text_chars / 400  # measured: the capacities follow
    assert prefixes.index.capacity[0] == int(500_000 * lookup.text_chars / 400 / 128)


def test_expected_cached_is_the_matched_share_of_the_prompt():
    assert expected_cached(0, 1000, 128, 250) == 0
    assert expected_cached(4, 1024, 128, 256) == 128
    assert expected_cached(9, 1024, 128, 256) == 256


def trained(cached_cost: float) -> LatencyModel:
    """A backend whose prefill costs 1 ms a token, and ``cached_cost`` of that for a cached one."""
    model = LatencyModel()
    for tokens, cached in [(1000, 0), (2000, 0), (1000, 900), (3000, 2800), (500, 0), (1500, 1400)] * 4:
        model.ttft.update(model.ttft_features(tokens, cached), 0.02 + 0.001 * (tokens - cached + cached_cost * cached))
    return model


def test_the_ttft_fit_learns_what_an_expected_cached_token_costs_on_each_backend():
    caching, not_caching = trained(0.0), trained(1.0)
    assert caching.cached_cost() < 0.05 and not_caching.cached_cost() > 0.9
    assert caching.predict(2000, 1900).ttft_s < 0.2 < not_caching.predict(2000, 1900).ttft_s
    assert LatencyModel().cached_cost() == 0.0  # the prior: cached is free until shown otherwise


def test_slo_prefers_the_backend_holding_the_prefix_while_it_fits_and_spreads_when_it_does_not():
    slo = SLO(ttft_ms=1500, tpot_ms=200)
    holder, other = (Member(name=n, backend=None, model="m", latency=trained(0.0)) for n in ("holder", "other"))
    clock = [0.0]
    dispatcher = Dispatcher(shed=False, clock=lambda: clock[0])
    waiter = Waiter(1200, 8, 0.0, slo, cached={"holder": 1100})
    dispatcher.arrive(waiter, [holder, other])
    assert [w.backend for w in dispatcher.ready([holder, other])] == ["holder"]
    for key in range(2, 40):  # the holder fills up: its predicted TTFT no longer fits
        holder.latency.started(key, 3000, 64)
    late = Waiter(1200, 8, 0.0, slo, cached={"holder": 1100})
    dispatcher.arrive(late, [holder, other])
    assert [w.backend for w in dispatcher.ready([holder, other])] == ["other"]

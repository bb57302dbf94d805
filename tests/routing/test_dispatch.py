"""The slo strategy's dispatcher on a virtual clock: it holds a request while no backend has room,
binds it when one frees up, protects the requests already decoding, and sheds at the deadline."""

from __future__ import annotations

from routing.dispatch import Dispatcher, Waiter
from tests.routing.policies import slo as SLO
from routing.strategies import Member

SLO_ = SLO(ttft_ms=1000, tpot_ms=100, e2e_ms=20000)


def fleet(clock: list[float], *names: str) -> list[Member]:
    members = [Member(name=n, backend=None, model=n) for n in names]
    for m in members:
        m.latency.clock = lambda: clock[0]
    return members


def teach(member: Member, ttft_s: float, tpot_base: float, tpot_per_seq: float) -> None:
    """What the backend has shown: a TTFT, and a TPOT growing with the batch (no prefill stalls)."""
    for _ in range(30):
        member.latency.ttft.update(member.latency.ttft_features(100), ttft_s)
        for batch in range(1, 9):
            member.latency.tpot.update([1.0, float(batch), 0.0], tpot_base + tpot_per_seq * batch)


def teach_prefill_stalls(member: Member) -> None:
    """TTFT 0.1 s, TPOT 50 ms + 10 ms a sequence, and each prompt token prefilled during a decode
    costs 1 ms of it."""
    teach(member, 0.1, 0.05, 0.01)
    for _ in range(60):
        member.latency.tpot.update([1.0, 2.0, 5.0], 0.05 + 0.02 + 0.005)


def waiter(clock: list[float], **fields) -> Waiter:
    return Waiter(100, 50, clock[0], fields.pop("slo", SLO_), **fields)


def test_the_request_goes_where_it_has_the_most_headroom():
    clock = [0.0]
    slow, fast = fleet(clock, "slow", "fast")
    teach(slow, 0.5, 0.05, 0.01)
    teach(fast, 0.1, 0.02, 0.005)
    d = Dispatcher(shed=True, clock=lambda: clock[0])
    w = waiter(clock)
    d.arrive(w, [slow, fast])
    assert d.ready([slow, fast]) == [w] and w.backend == "fast" and w.key in fast.latency.in_flight


def test_a_request_is_held_while_it_would_miss_its_tpot_and_bound_when_a_slot_frees():
    clock = [0.0]
    (only,) = fleet(clock, "only")
    teach(only, 0.1, 0.04, 0.018)  # TPOT = 40 + 18 ms per sequence: at most 3 fit a 100 ms SLO
    only.latency.batch_limit = 8     # its /metrics showed a batch of 8
    d = Dispatcher(shed=True, clock=lambda: clock[0])
    first = [waiter(clock) for _ in range(3)]
    for w in first:
        d.arrive(w, [only])
    assert [w.backend for w in d.ready([only])] == ["only"] * 3
    late = waiter(clock)
    d.arrive(late, [only])
    assert d.ready([only]) == [] and d.queue == [late]  # a fourth would decode at 112 ms: held
    clock[0] = 0.3
    only.latency.finished(first[0].key)
    assert d.ready([only]) == [late] and late.backend == "only"


def test_what_cannot_be_served_by_its_deadline_is_shed_or_with_shed_off_sent_anyway():
    for shed in (True, False):
        clock = [0.0]
        (only,) = fleet(clock, "only")
        teach(only, 0.2, 0.04, 0.018)
        only.latency.batch_limit = 8
        d = Dispatcher(shed=shed, clock=lambda: clock[0])
        busy = [waiter(clock) for _ in range(3)]
        for w in busy:
            d.arrive(w, [only])
        d.ready([only])
        held = waiter(clock)
        d.arrive(held, [only])
        assert d.ready([only]) == [] and d.next_deadline() == held.deadline
        assert held.deadline < 1.0  # 1 s TTFT SLO minus what the backend needs to start it
        clock[0] = held.deadline
        assert d.ready([only]) == [held]
        assert held.backend == (None if shed else "only")
        if shed:
            assert "best: only" in held.reason and held.retry_after_s >= 1


def test_a_newcomer_may_not_push_the_requests_decoding_past_their_tpot():
    clock = [0.0]
    (only,) = fleet(clock, "only")
    teach_prefill_stalls(only)
    d = Dispatcher(shed=True, clock=lambda: clock[0])
    decoding = waiter(clock)
    d.arrive(decoding, [only])
    d.ready([only])
    only.latency.first_token(decoding.key, decoding.features)
    clock[0] = 1.0
    loose = SLO(ttft_ms=10000, tpot_ms=100)
    short = Waiter(50, 2, clock[0], loose)
    huge = Waiter(1500, 2, clock[0], loose)  # its prefill would add 1.5 s / 49 tokens to the decoding one
    d.arrive(short, [only])
    d.arrive(huge, [only])
    assert d.ready([only]) == [short] and d.queue == [huge]


def test_a_negative_priority_is_held_to_a_tighter_ttft():
    clock = [0.0]
    (only,) = fleet(clock, "only")
    teach(only, 0.8, 0.02, 0.0)
    d = Dispatcher(shed=True, clock=lambda: clock[0])
    normal, low = waiter(clock), waiter(clock, priority=-1)  # 1000 ms vs 750 ms
    d.arrive(normal, [only])
    d.arrive(low, [only])
    d.ready([only])
    assert normal.backend == "only" and low.decided and low.backend is None


def test_before_the_batch_limit_is_known_one_more_than_seen_decoding_goes_at_a_time():
    clock = [0.0]
    (only,) = fleet(clock, "only")
    teach(only, 0.1, 0.02, 0.0)  # TPOT and TTFT leave room for many: only the unknown batch limit holds
    d = Dispatcher(shed=True, clock=lambda: clock[0])
    burst = [waiter(clock) for _ in range(3)]
    for w in burst:
        d.arrive(w, [only])
    assert d.ready([only]) == [burst[0]] and d.queue == burst[1:]  # nothing seen decoding yet: one
    clock[0] = 0.1
    only.latency.first_token(burst[0].key, burst[0].features)
    assert d.ready([only]) == [burst[1]] and d.queue == [burst[2]]  # one seen decoding: two in flight
    only.latency.batch_limit = 8  # its /metrics showed a full batch of 8
    assert d.ready([only]) == [burst[2]]


def test_a_newcomer_may_not_stall_a_request_still_waiting_for_its_first_token_past_its_tpot():
    clock = [0.0]
    (only,) = fleet(clock, "only")
    teach_prefill_stalls(only)
    only.latency.batch_limit = 8
    d = Dispatcher(shed=True, clock=lambda: clock[0])
    queued = waiter(clock)  # sent, no first token yet: all 49 of its decode steps are ahead
    d.arrive(queued, [only])
    d.ready([only])
    loose = SLO(ttft_ms=10000, tpot_ms=100)
    short, huge = Waiter(50, 2, clock[0], loose), Waiter(1500, 2, clock[0], loose)
    d.arrive(huge, [only])
    d.arrive(short, [only])
    assert d.ready([only]) == [short] and d.queue == [huge]


def test_among_equal_priority_the_cheapest_held_request_takes_a_freed_slot_and_the_costly_one_is_shed():
    clock = [0.0]
    (only,) = fleet(clock, "only")
    teach(only, 0.2, 0.04, 0.018)  # at most 3 in the batch within a 100 ms TPOT
    only.latency.batch_limit = 8
    d = Dispatcher(shed=True, clock=lambda: clock[0])
    busy = [waiter(clock) for _ in range(3)]
    for w in busy:
        d.arrive(w, [only])
    d.ready([only])
    costly = Waiter(700, 96, clock[0], SLO_)        # arrives first
    cheap = Waiter(100, 16, clock[0] + 0.01, SLO_)  # arrives later, a sixth of the work
    urgent = Waiter(700, 96, clock[0] + 0.02, SLO_, priority=1)
    for w in (costly, cheap, urgent):
        d.arrive(w, [only])
    assert d.queue == [urgent, cheap, costly]  # priority first, then cost
    clock[0] = 0.2
    only.latency.finished(busy[0].key)
    assert d.ready([only]) == [urgent]
    only.latency.finished(busy[1].key)
    assert d.ready([only]) == [cheap]
    clock[0] = costly.deadline
    assert d.ready([only]) == [costly] and costly.backend is None and costly.retry_after_s >= 1


def decoding_one(clock: list[float]):
    """A backend that has learnt 50 ms + 10 ms a sequence and 1 ms per prompt token prefilled meanwhile
    (batch limit 8), with request 1 (100 prompt tokens) decoding since ``clock[0]``, 50 steps to go."""
    (only,) = fleet(clock, "only")
    teach_prefill_stalls(only)
    only.latency.batch_limit = 8
    features, _ = only.latency.started(1, 100, max_tokens=51)
    only.latency.first_token(1, features)
    return only


def test_a_decoding_request_slowed_by_a_prefill_is_protected_for_the_tokens_it_really_has_left():
    clock = [0.0]
    only = decoding_one(clock)  # request 1 decoding from t = 0, 50 steps to go
    latency = only.latency
    features, _ = latency.started(2, 600, max_tokens=4)   # its 600-token prefill stalls request 1 for 0.6 s
    clock[0] = 0.7
    latency.first_token(2, features)
    clock[0] = 1.0
    latency.finished(2)
    # At t = 1 s request 1 has made about 6 steps (0.6 s stalled, then 0.3 s at a batch of two), not the
    # 16 that 1 s at today's pace would give: with a newcomer its TPOT ends near 84 ms, over an 80 ms SLO.
    tight = SLO(ttft_ms=10000, tpot_ms=80)
    d = Dispatcher(shed=True, clock=lambda: clock[0])
    newcomer = Waiter(100, 2, clock[0], tight)
    d.arrive(newcomer, [only])
    assert d.ready([only]) == [] and d.queue == [newcomer]
    clock[0] = 3.7  # request 1 ended (alone it made 72 ms): the newcomer is bound
    latency.finished(1)
    assert d.ready([only]) == [newcomer] and newcomer.backend == "only"


def test_a_newcomer_counts_the_prefills_still_due_before_it_among_those_it_would_stall():
    clock = [0.0]
    only = decoding_one(clock)  # request 1 decoding from t = 0, 50 steps to go
    latency = only.latency
    for key in (2, 3):  # sent after it, one token each, none yet: their 600-token prefills stall it by 1.2 s
        latency.started(key, 600, max_tokens=1)
    # Request 1 alone with the newcomer: 50 steps at a batch of four (90 ms) + 0.1 s of its prefill, 92 ms;
    # with the 1.2 s of prefills still due there, 116 ms: over a 100 ms SLO.
    d = Dispatcher(shed=True, clock=lambda: clock[0])
    newcomer = Waiter(100, 2, clock[0], SLO(ttft_ms=10000, tpot_ms=100))
    d.arrive(newcomer, [only])
    assert d.ready([only]) == [] and d.queue == [newcomer]
    for key in (2, 3):
        latency.finished(key)
    assert d.ready([only]) == [newcomer] and newcomer.backend == "only"


def serve_burst(members: list[Member], clock: list[float], waiters: list[Waiter], until: float,
                prefill_tok_s: float = 500.0) -> None:
    """The dispatcher over fresh ``members`` in virtual time, each a FIFO engine that prefills one prompt
    at a time at ``prefill_tok_s`` (a first token when its prefill ends; nothing finishes before ``until``)."""
    d = Dispatcher(shed=False, clock=lambda: clock[0])
    free_at = {m.name: 0.0 for m in members}
    firsts: list[tuple[float, Waiter]] = []

    def bind() -> None:  # the route pumps the dispatcher at each arrival and each first token
        for w in d.ready(members):
            start = max(clock[0], free_at[w.backend])
            free_at[w.backend] = start + w.prompt_tokens / prefill_tok_s
            firsts.append((free_at[w.backend], w))
    for w in waiters:
        d.arrive(w, members)
        bind()
    while True:
        bind()
        firsts.sort(key=lambda event: event[0])
        if not firsts or firsts[0][0] > until:
            return
        clock[0], w = firsts.pop(0)
        next(m for m in members if m.name == w.backend).latency.first_token(w.key, w.features)


def test_a_burst_of_streams_spreads_over_fresh_backends_while_one_prefills_a_long_prompt():
    """bench/disagg.py's start: 8 streams and a 1,000-token prompt at once on two backends nothing is known of.
    The long prompt (the cheapest held request) takes the second slot of the backend that answers first; the
    streams must not all go to the other while that prefill delays the first backend's next first token
    (they did, 7 of 8: the probe for room held the first backend at two in flight until that prefill ended)."""
    clock = [0.0]
    members = fleet(clock, "w0", "w1")
    slo = SLO(ttft_ms=5000, tpot_ms=150)
    streams, long = [Waiter(32, 200, 0.0, slo) for _ in range(8)], Waiter(1000, 16, 0.0, slo)
    serve_burst(members, clock, streams + [long], until=1.0)  # the long prefill ends at 2 s
    assert all(w.decided for w in streams)
    placed = {m.name: sum(1 for w in streams if w.backend == m.name) for m in members}
    other = next(m.name for m in members if m.name != long.backend)
    assert (placed[long.backend], placed[other]) == (3, 5)  # 4 and 5 in flight: the long prompt is one of them

"""bench/slo.py's fleet and workload in virtual time: the routing policies in seconds instead of minutes.

Each backend is the queueing fake's engine (``fakes/queueing.py``) replayed as a
discrete-event model: FIFO queue, at most ``batch_limit`` sequences in the batch, the queue's head
enters at a step boundary, a step is the prefill of the oldest unprefilled sequence
(``prompt / prefill_tok_s``, yields its first token; decode waits) or a decode step of ``tpot(n)``.
The gateway side is the real ``routing`` code (``LatencyModel``, ``Dispatcher``) driven by a virtual
clock, so what this prints is what the route's policy does on that engine, minus HTTP and CPU noise
(``--overhead-ms`` adds a fixed delay per hop). Requests are judged as bench/slo.py judges them.

The engines have the queueing fake's prefix cache (``fakes.queueing.PrefixCache``) when their model
sets ``prefix_cache_tokens``: a request's prompt (the words of its rendered chat, as the fake counts
them) is looked up when it enters the batch and only the uncached tokens are prefilled. The gateway
keeps the route's prefix index (``routing.prefix``) for ``slo`` and ``prefix``, as ``infer serve``
does. bench/slo.py's prompts share no prefix (each starts with its own number; ``--shared-text``
sends its old ``abc abc ...`` prompts, which share long prefixes on a fleet without prefix caching:
the route must learn that a cached-looking token costs full price there). ``--conversations N``
replays bench/prefix.py's multi-turn workload and fleet instead (sessions of turns with think time;
the next turn is sent when the answer is in and the think time has passed) and prints mean and p90
TTFT, each backend's share and the cache-hit ratio per policy.

    .venv/bin/python bench/slo_sim.py [--loads 0.5,0.9,1.2] [--seconds 60] [--seeds 13,14,15] [--policies slo,least_inflight] [--fresh] [--known-limits]
    .venv/bin/python bench/slo_sim.py --conversations 24 --seeds 7,8,9 --policies prefix,slo,least_inflight,round_robin
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))  # ahead of bench/ (the script's folder), whose gateway.py is not the package

from core.base import GenerationRequest  # noqa: E402
from benchmark.conversations import Workload, conversations  # noqa: E402
from fakes.engine import FakeEngine  # noqa: E402
from fakes.queueing import PrefixCache  # noqa: E402
from routing.dispatch import Dispatcher, Waiter  # noqa: E402
from routing.predictor import median  # noqa: E402
from gateway.backends_config import PrefixEntry, SLOEntry  # noqa: E402
from routing.build import prefix_policy, slo_policy  # noqa: E402
from routing.prefix import RoutePrefixes  # noqa: E402
from routing.slo import SLO as RouteSLO  # noqa: E402
from routing.strategies import Member, Orderer  # noqa: E402
from slo import FLEET, SLO, Call, fleet_capacity, print_system_goodput, workload  # noqa: E402
from fakes.queueing import QueueModel  # noqa: E402


@dataclass(eq=False)
class SimRequest:
    call: Call
    prompt_tokens: int
    arrival: float
    backend: str | None = None
    sent: float | None = None
    first: float | None = None
    last: float | None = None
    produced: int = 0
    prefilled: bool = False
    shed: bool = False
    key: int = 0
    features: list = field(default_factory=list)
    predicted: object = None
    tpot_features: list | None = None
    messages: list = field(default_factory=list)   # the chat as sent
    keys: list = field(default_factory=list)       # the engine's prefix-cache keys of its prompt
    lookup: object = None                          # the route's prefix lookup
    cached: int = 0                                # prompt tokens the engine found cached
    on_done: object = None                         # the next turn of its conversation


POLL_S = 2.0  # the gateway's health poll with routes (routing.route.HEALTH_POLL_S)
KNOWN_LIMITS = False


class SimEngine:
    """One backend: the queueing fake's step loop, advanced by events."""

    def __init__(self, name: str, model: QueueModel, sim: "Sim"):
        self.name, self.model, self.sim = name, model, sim
        self.cache = PrefixCache(model.prefix_cache_tokens, model.block_size) if model.prefix_cache_tokens else None
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.busy_until: float | None = None  # end of the current step
        self.step: tuple | None = None

    def submit(self, req: SimRequest, now: float) -> None:
        if self.cache is not None and not req.keys:
            req.keys = self.cache.keys(FakeEngine.render(req.messages).split())
        self.waiting.append(req)
        if self.busy_until is None:
            self._next(now)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.model.batch_limit:
            req = self.waiting.pop(0)
            if self.cache is not None:
                req.cached = self.cache.lookup(req.keys, req.prompt_tokens)
            self.running.append(req)

    def _next(self, now: float) -> None:
        self._retire(now)
        self._admit()
        if not self.running:
            self.busy_until, self.step = None, None
            return
        pending = next((r for r in self.running if not r.prefilled), None)
        if pending is not None:
            self.step = ("prefill", pending)
            duration = self.model.prefill(pending.prompt_tokens, pending.cached)
        else:
            self.step = ("decode", list(self.running))
            duration = self.model.tpot(len(self.running))
        self.busy_until = now + duration
        self.sim.at(self.busy_until, self._end_step)

    def _end_step(self, now: float) -> None:
        kind, what = self.step
        if kind == "prefill":
            what.prefilled = True
            if self.cache is not None:
                self.cache.store(what.keys)
            self._emit(what, now)
        else:
            for req in what:
                self._emit(req, now)
        self._next(now)

    def _emit(self, req: SimRequest, now: float) -> None:
        if req.produced >= req.call.max_tokens:
            return
        req.produced += 1
        delay = self.sim.overhead
        if req.produced == 1:
            self.sim.at(now + delay, lambda t, r=req: self.sim.first_token(r, t))
        if req.produced == req.call.max_tokens:
            req.last = now + delay

    def _retire(self, now: float) -> None:
        for req in [r for r in self.running if r.prefilled and r.produced >= r.call.max_tokens]:
            self.running.remove(req)
            self.sim.at(now + self.sim.overhead, lambda t, r=req: self.sim.finished(r, t))


class Sim:
    """The event queue, the fleet, and the gateway's side (a ``Dispatcher`` over ``LatencyModel``s)."""

    def __init__(self, policy: str, slo: RouteSLO, shed: bool, overhead: float = 0.003, fleet: dict | None = None):
        self.now, self.overhead = 0.0, overhead
        self.events: list = []
        self.seq = itertools.count()
        fleet = fleet or FLEET
        self.engines = {name: SimEngine(name, model, self) for name, model in fleet.items()}
        self.members = [Member(name=name, backend=None, model=name) for name in fleet]
        self.prefixes = RoutePrefixes("sim", list(fleet), prefix_policy(PrefixEntry())) if policy in ("slo", "prefix") else None
        self.models = {m.name: m.latency for m in self.members}
        for m in self.members:
            m.latency.clock = lambda: self.now
            if KNOWN_LIMITS:  # bench/slo.py's other sides fill the fleet; the slo route's poller sees it
                m.latency.batch_limit = fleet[m.name].batch_limit
        self.policy, self.slo = policy, slo
        self.dispatcher = Dispatcher(shed, clock=lambda: self.now)
        self.orderer = Orderer(policy)
        self.requests: list[SimRequest] = []
        self.polling = False

    def at(self, when: float, fn) -> None:
        heapq.heappush(self.events, (when, next(self.seq), fn))

    def run(self, calls: list[Call], grace: float) -> list[SimRequest]:
        """The calls from now on (their times relative to now), then ``grace`` s; the fleet keeps its
        state and the gateway what it learnt, as one ``infer serve`` does across bench/slo.py's runs."""
        start, self.requests = self.now, []
        for call in calls:
            req = SimRequest(call, call.words + 1, start + call.at, messages=call_messages(call))
            self.requests.append(req)
            self.at(req.arrival, lambda t, r=req: self.arrive(r, t))
        end = start + (calls[-1].at if calls else 0) + grace
        self.drive(end)
        return self.requests

    def drive(self, end: float) -> None:
        if not self.polling:
            self.polling = True
            self.at(self.now + POLL_S, self.poll)
        while self.events and self.events[0][0] <= end:
            self.now, _, fn = heapq.heappop(self.events)
            fn(self.now)
        self.now = max(self.now, end)

    def poll(self, now: float) -> None:
        """The route's health poller: each backend's running and waiting, as its /metrics says."""
        for name, engine in self.engines.items():
            self.models[name].reported(len(engine.running), len(engine.waiting))
            if self.prefixes is not None and engine.cache is not None:  # vLLM's cache_config_info
                self.prefixes.set_capacity(name, engine.model.prefix_cache_tokens, "reported")
        self.at(now + POLL_S, self.poll)

    # -- the gateway ------------------------------------------------------------------------------

    def arrive(self, req: SimRequest, now: float) -> None:
        if self.prefixes is not None:
            req.lookup = self.prefixes.lookup(GenerationRequest(model="sim", messages=req.messages), req.prompt_tokens)
        cached = req.lookup.cached if req.lookup is not None else {}
        if self.policy != "slo":
            predictions = {m.name: m.latency.predict(req.prompt_tokens, cached.get(m.name, 0)) for m in self.members}
            first = self.prefixes.pick(req.lookup, self.members) if self.policy == "prefix" else None
            member = self.orderer.order(self.members, predictions, self.slo, req.call.max_tokens, first)[0]
            req.key = next(self.seq)
            req.features, req.predicted = member.latency.started(req.key, req.prompt_tokens, req.call.max_tokens,
                                                                 cached.get(member.name, 0))
            self.send(req, member.name, now)
            return
        waiter = Waiter(req.prompt_tokens, req.call.max_tokens, now, self.slo, payload=req, cached=cached)
        self.dispatcher.arrive(waiter, self.members)
        if waiter.decided:
            req.shed = True
        self.pump(now)

    def send(self, req: SimRequest, name: str, now: float) -> None:
        req.backend, req.sent = name, now
        if req.lookup is not None:
            self.prefixes.sent(name, req.lookup)
        self.engines[name].submit(req, now + self.overhead)

    def pump(self, now: float) -> None:
        for waiter in self.dispatcher.ready(self.members):
            req = waiter.payload
            if waiter.backend is None:
                req.shed = True
                continue
            req.key, req.features, req.predicted = waiter.key, waiter.features, waiter.prediction
            self.send(req, waiter.backend, now)
        deadline = self.dispatcher.next_deadline()
        if deadline is not None:
            self.at(max(deadline, now + 1e-4), self.pump)

    def first_token(self, req: SimRequest, now: float) -> None:
        req.first = now
        self.models[req.backend].first_token(req.key, req.features)
        self.pump(now)

    def finished(self, req: SimRequest, now: float) -> None:
        n = req.call.max_tokens
        tpot = (req.last - req.first) / (n - 1) if n > 1 else None
        self.models[req.backend].finished(req.key, tpot, n)
        if req.lookup is not None:  # as the route hears it from the backend's usage
            self.prefixes.served(req.backend, req.lookup, req.prompt_tokens,
                                 req.cached if self.engines[req.backend].cache is not None else None)
        if req.on_done is not None:
            req.on_done(now)
        self.pump(now)


SHARED_TEXT = False  # --shared-text: bench/slo.py's old prompts, "abc abc ...", which share prefixes


def call_messages(call: Call) -> list[dict]:
    """bench/slo.py's chat: ``words`` words (one token each on the fakes), its first the request's own."""
    if SHARED_TEXT:
        return [{"role": "user", "content": " ".join(["abc"] * call.words)}]
    return [{"role": "user", "content": " ".join([f"r{call.at:.9f}"] + ["abc"] * (call.words - 1))}]


def judge(req: SimRequest) -> bool:
    if req.shed or req.first is None or req.last is None:
        return False
    n = req.call.max_tokens
    tpot = (req.last - req.first) / (n - 1) if n > 1 else 0.0
    return (req.first - req.arrival) * 1000 <= SLO["ttft_ms"] and tpot * 1000 <= SLO["tpot_ms"] \
        and (req.last - req.arrival) * 1000 <= SLO["e2e_ms"]


def summary(reqs: list[SimRequest], sim: Sim) -> dict:
    good = [r for r in reqs if judge(r)]
    shed = sum(1 for r in reqs if r.shed)
    done = [r for r in reqs if r.last is not None]
    first = min(r.arrival for r in reqs)
    duration = max((r.last for r in done), default=first) - first
    missed = {"ttft": 0, "tpot": 0, "e2e": 0}
    for r in done:
        n = r.call.max_tokens
        missed["ttft"] += (r.first - r.arrival) * 1000 > SLO["ttft_ms"]
        missed["tpot"] += n > 1 and (r.last - r.first) / (n - 1) * 1000 > SLO["tpot_ms"]
        missed["e2e"] += (r.last - r.arrival) * 1000 > SLO["e2e_ms"]
    return {"requests": len(reqs), "good": len(good), "shed": shed, "unfinished": len(reqs) - len(done) - shed,
            "attainment": len(good) / len(reqs), "admitted": len(good) / max(1, len(reqs) - shed),
            "goodput": len(good) / duration if duration else 0.0, "missed": missed,
            "pred_err": median([e for m in sim.models.values() for e in m.errors]),
            "tpot_err": median([e for m in sim.models.values() for e in m.tpot_errors]),
            "served": {n: sum(1 for r in reqs if r.backend == n) for n in FLEET}}


def simulate(policy: str, loads: list[float], seconds: float, seed: int, shed: bool, warmup: float,
             fresh: bool = False, debug: bool = False) -> list[dict]:
    """One row per load: bench/slo.py's sequence (warm-up at 0.5x, then each load with seed + its index)
    on one gateway and fleet, or with ``fresh`` a new one (and its warm-up) per load."""
    cap = fleet_capacity()["rps"]
    slo = slo_policy(SLOEntry(ttft_ms=SLO["ttft_ms"], tpot_ms=SLO["tpot_ms"], e2e_ms=SLO["e2e_ms"]))
    rows, sim = [], None
    for index, load in enumerate(loads):
        if sim is None or fresh:
            sim = Sim(policy, slo, shed)
            if warmup:
                sim.run(workload(0.5 * cap, warmup, seed + 99), grace=30)
        for model in sim.models.values():
            model.errors.clear()
            model.tpot_errors.clear()
        rows.append(summary(sim.run(workload(load * cap, seconds, seed + index), grace=30), sim))
        if debug:
            for m in sim.members:
                lat = m.latency
                print(f"   {m.name}: ttft w={[round(w, 5) for w in lat.ttft.w]} tpot v={[round(v, 5) for v in lat.tpot.w]} "
                      f"rho={lat.prefill_rate():.0f} L={lat.batch_limit} err={lat.median_error() or 0:.2f} "
                      f"r_ttft={lat.ratio('ttft', 0.8):.2f} r_tpot={lat.ratio('tpot', 0.8):.2f}")
    return rows


def simulate_conversations(policy: str, count: int, seed: int, systems: int | None = None) -> dict:
    """bench/prefix.py's sessions on its fleet, in virtual time: TTFT, shares and the cache-hit ratio."""
    from prefix import FLEET as PREFIX_FLEET, SLO as PREFIX_SLO

    slo = slo_policy(SLOEntry(ttft_ms=PREFIX_SLO["ttft_ms"], tpot_ms=PREFIX_SLO["tpot_ms"]))
    sim = Sim(policy, slo, shed=False, fleet=PREFIX_FLEET)
    sim.at(POLL_S, sim.poll)
    done: list[SimRequest] = []

    def send_turn(conv, index: int, messages: list[dict], now: float) -> None:
        step = conv.turns[index]
        messages = messages + [{"role": "user", "content": step.user}]
        tokens = len(FakeEngine.render(messages).split())
        req = SimRequest(Call(now, tokens - 1, step.max_tokens), tokens, now, messages=messages)
        reply = {"role": "assistant", "content": FakeEngine.expected_text(messages, step.max_tokens)}

        def next_turn(t: float) -> None:
            done.append(req)
            if index + 1 < len(conv.turns):
                sim.at(t + step.think_s, lambda t2: send_turn(conv, index + 1, messages + [reply], t2))
        req.on_done = next_turn
        sim.arrive(req, now)

    for conv in conversations(Workload(count=count, systems=systems), seed):
        sim.at(conv.start_s, lambda t, c=conv: send_turn(c, 0, [c.system_message()], t))
    sim.drive(3600.0)
    ttfts = sorted(r.first - r.arrival for r in done)
    served = {n: sum(1 for r in done if r.backend == n) for n in PREFIX_FLEET}
    return {"requests": len(done), "ttft_mean_ms": statistics.fmean(ttfts) * 1000,
            "ttft_p90_ms": ttfts[int(0.9 * len(ttfts))] * 1000,
            "shares": {n: v / max(1, len(done)) for n, v in served.items()},
            "cache_hit_ratio": sum(r.cached for r in done) / max(1, sum(r.prompt_tokens for r in done))}


def print_conversations(policies: list[str], count: int, seeds: list[int], systems: int | None = None) -> None:
    rows = {p: [simulate_conversations(p, count, seed, systems) for seed in seeds] for p in policies}
    base = statistics.median(r["ttft_mean_ms"] for r in rows.get("least_inflight", [])) if "least_inflight" in rows \
        else None
    print(f"{count} conversations ({systems or 'one'} system prompt(s){'' if systems else ' each'}; bench/prefix.py's "
          f"workload and fleet), seeds {','.join(map(str, seeds))}; medians over the seeds")
    print(f"{'policy':15s} {'reqs':>5s} {'ttft mean':>9s} {'ttft p90':>9s} {'/li':>5s} {'max share':>9s} {'hit ratio':>9s}")
    for policy, runs in rows.items():
        mean = statistics.median(r["ttft_mean_ms"] for r in runs)
        top = statistics.median(max(r["shares"].values()) for r in runs)
        print(f"{policy:15s} {statistics.median(r['requests'] for r in runs):5.0f} {mean:9.0f} "
              f"{statistics.median(r['ttft_p90_ms'] for r in runs):9.0f} "
              f"{mean / base if base else float('nan'):5.2f} {top:9.0%} "
              f"{statistics.median(r['cache_hit_ratio'] for r in runs):9.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="0.5,0.9,1.2")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seeds", default="13")
    parser.add_argument("--policies", default="slo,least_inflight,round_robin")
    parser.add_argument("--warmup", type=float, default=15)
    parser.add_argument("--known-limits", action="store_true",
                        help="the route knows each backend's batch limit from the start (in bench/slo.py its "
                             "poller learns them while the other sides fill the fleet)")
    parser.add_argument("--fresh", action="store_true",
                        help="a new gateway and fleet (and warm-up) per load instead of one across the loads")
    parser.add_argument("--debug", action="store_true", help="print each backend's fitted models")
    parser.add_argument("--shared-text", action="store_true", help="bench/slo.py's old prompts (abc abc ...), "
                        "which share prefixes, on its fleet without prefix caching")
    parser.add_argument("--conversations", type=int, default=0, metavar="N",
                        help="bench/prefix.py's multi-turn workload (N conversations) and fleet instead")
    parser.add_argument("--systems", type=int, help="with --conversations: system prompts shared round-robin "
                        "(default: one per conversation)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a routing.dispatch constant (e.g. ERROR_QUANTILE=0.9) to compare policies")
    args = parser.parse_args()
    global KNOWN_LIMITS, SHARED_TEXT
    KNOWN_LIMITS, SHARED_TEXT = args.known_limits, args.shared_text
    if args.conversations:
        return print_conversations(args.policies.split(","), args.conversations, [int(x) for x in args.seeds.split(",")],
                                   args.systems)
    import routing.dispatch as dispatch
    for item in args.set:
        name, value = item.split("=", 1)
        current = getattr(dispatch, name)
        setattr(dispatch, name, value in ("True", "1") if isinstance(current, bool) else type(current)(value))
    print(f"{'load':>4s} {'policy':15s} {'reqs':>5s} {'good':>5s} {'shed':>4s} {'attain':>6s} {'adm.at':>6s} "
          f"{'goodput':>7s} {'pred.err':>8s} {'tpot.err':>8s}  missed ttft/tpot/e2e  served")
    loads = [float(x) for x in args.loads.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    medians = []  # per policy and load: the median attainment over the seeds, for the system goodput
    capacity = fleet_capacity()["rps"]
    for policy in args.policies.split(","):
        table = [simulate(policy, loads, args.seconds, seed, policy == "slo", args.warmup, args.fresh, args.debug)
                 for seed in seeds]
        for index, load in enumerate(loads):
            rows = [per_seed[index] for per_seed in table]
            medians.append({"side": policy, "load": load, "rate_rps": load * capacity,
                            "attainment": statistics.median(r["attainment"] for r in rows)})
            for row in rows:
                err = " ".join(f"{row[k]:8.1%}" if row[k] is not None else f"{'-':>8s}"
                               for k in ("pred_err", "tpot_err"))
                print(f"{load:4.1f} {policy:15s} {row['requests']:5d} {row['good']:5d} {row['shed']:4d} "
                      f"{row['attainment']:6.3f} {row['admitted']:6.3f} {row['goodput']:7.3f} {err}  "
                      f"{row['missed']['ttft']:3d}/{row['missed']['tpot']:3d}/{row['missed']['e2e']:3d}  "
                      f"{'/'.join(str(v) for v in row['served'].values())}")
            if len(rows) > 1:
                print(f"{load:4.1f} {policy:15s} median attainment {statistics.median(r['attainment'] for r in rows):.3f} "
                      f"admitted {statistics.median(r['admitted'] for r in rows):.3f} "
                      f"goodput {statistics.median(r['goodput'] for r in rows):.3f}")
    print_system_goodput(medians)  # from the median attainment over the seeds at each load


if __name__ == "__main__":
    main()

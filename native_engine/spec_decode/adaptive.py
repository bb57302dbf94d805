"""How many draft tokens each sequence verifies next step, from what has paid so far (torch-free).

Two measurements drive it:
- acceptance: per sequence, an exponential average of the share of its drafts the target accepted (a new
  sequence starts from the model's average);
- cost: the wall time of decode-only steps by their number of query tokens T (rows plus drafts).
  A verify step on a GPU at small batch costs about what a decode step costs; on a CPU, or at a large
  batch, the extra query rows cost nearly their share, and speculation loses.

Per step at batch B: a plain step takes t(B), t(B) / B per token; the drafts on offer would make it
t(B + K), so each query row costs s = (t(B + K) - t(B)) / K. Sequence i verifies its drafts j = 1, 2, ..
while a_i^j (the chance draft j is accepted: every one before it must be) is worth more than s, in
tokens of t(B) / B each; then the whole step must beat a plain one in expected tokens per second,
(B + sum E_i) / t(B + sum k_i) > B / t(B), E_i = a_i + a_i^2 + .. + a_i^k_i, or nobody speculates.
A sequence whose expected gain is below its cost even alone (at batch 1, for any k) sits out, and
tries again after a back-off that doubles each time (4, 8, .. 64 steps), so an open-ended text stops
paying for misses. Proposals that are not verified are still checked, for free, against the token the
target chose (their first draft): a sequence's acceptance keeps being tracked, and one sitting out comes
back as soon as its text turns copyable (an answer that starts with its own words, then quotes). Unmeasured step sizes are
extrapolated from the two largest measured (flat from a single one, so a larger size is tried once and
then known)."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from statistics import median

_EMA = 0.3  # weight of the newest acceptance
_WINDOW, _MIN_SAMPLES = 9, 3  # step times kept per size; needed before a plain step's time counts
_TTL = 256  # decode steps after which a size's samples are forgotten unless refreshed
_REST, _REST_FROM = 16, 8  # steps a batch of 8+ rows goes without proposals after they did not pay in it
_SHADOW_EMA = 0.15  # weight of a proposal checked without verifying it (its first draft against the token)
_PRIOR = 0.6  # acceptance assumed before a model has any
_BACKOFF_MIN, _BACKOFF_MAX = 4, 64


def _drafts_worth(alpha: float, k: int, threshold: float) -> int:
    """The most drafts j <= k with alpha^j > threshold (each draft is accepted only after the ones before)."""
    j = 0
    while j < k and alpha ** (j + 1) > threshold:
        j += 1
    return j


def expected_accepted(alpha: float, k: int) -> float:
    """Expected accepted drafts of k when each is accepted with probability alpha (until the first miss)."""
    return sum(alpha**j for j in range(1, k + 1))


@dataclass(slots=True)
class _SeqState:
    alpha: float
    skip: int = 0  # steps left sitting out
    backoff: int = _BACKOFF_MIN


class StepCosts:
    """Wall time of decode-only steps by query tokens: the median of the last few (a shared machine's
    stalls are outliers; a shape's first step is left out: it pays one-off costs). A plain step's time,
    what speculation must beat, counts after `_MIN_SAMPLES`; a larger size's cost after one sample (a probe
    of a size that does not pay, one step after its first, is enough, and it sets the slope that sizes
    above it are extrapolated with)."""

    def __init__(self) -> None:
        self.samples: dict[int, deque[float]] = {}
        self.sizes: list[int] = []  # sizes with a sample, sorted
        self.updated: dict[int, int] = {}  # size -> the step count at its last sample
        self.first: set[int] = set()  # sizes whose first step was seen (and left out)
        self.steps = 0

    def record(self, num_tokens: int, seconds: float) -> None:
        self.steps += 1
        if num_tokens not in self.first:  # a shape's first step pays one-off costs (oneDNN primitives, buffers)
            self.first.add(num_tokens)
            return
        window = self.samples.get(num_tokens)
        if window is None:
            window = self.samples[num_tokens] = deque(maxlen=_WINDOW)
            self.sizes.insert(bisect_left(self.sizes, num_tokens), num_tokens)
        window.append(seconds)
        self.updated[num_tokens] = self.steps
        if self.steps % _TTL == 0:
            self._expire()

    def _expire(self) -> None:
        """Forget sizes not sampled for `_TTL` steps: a probe taken during a stall, or a machine whose load
        changed, is measured again."""
        for size in [s for s, at in self.updated.items() if self.steps - at > _TTL]:
            del self.samples[size], self.updated[size]
            self.sizes.remove(size)

    def measured(self, num_tokens: int) -> float | None:
        window = self.samples.get(num_tokens)
        return median(window) if window is not None and len(window) >= _MIN_SAMPLES else None

    def _cost(self, num_tokens: int) -> float:
        return median(self.samples[num_tokens])

    def estimate(self, num_tokens: int) -> float | None:
        """Sampled, else interpolated between sampled sizes; above them, extrapolated with the slope of the
        two largest (never below the largest: a single size extrapolates flat, so a larger size is tried)."""
        if num_tokens in self.samples:
            return self._cost(num_tokens)
        i = bisect_left(self.sizes, num_tokens)
        if i == 0:
            return None
        lo = self.sizes[i - 1]
        if i == len(self.sizes):
            if i == 1:
                return self._cost(lo)
            below = self.sizes[i - 2]
            slope = max(0.0, (self._cost(lo) - self._cost(below)) / (lo - below))
            return self._cost(lo) + slope * (num_tokens - lo)
        hi = self.sizes[i]
        w = (num_tokens - lo) / (hi - lo)
        return self._cost(lo) * (1 - w) + self._cost(hi) * w


class AdaptiveK:
    def __init__(self, k: int, adaptive: bool = True) -> None:
        self.k, self.adaptive = k, adaptive
        self.costs = StepCosts()
        self.model_alpha = _PRIOR
        self.seqs: dict[int, _SeqState] = {}
        self.resting: dict[int, int] = {}  # batch size -> steps left without proposals (they did not pay)

    def worth_trying(self, batch: int) -> bool:
        """False while a batch of this size rests after speculation did not pay in it: the proposer is not
        even asked (at 16 rows its n-gram lookups cost a few percent of a CPU step)."""
        left = self.resting.get(batch, 0)
        if left > 0:
            self.resting[batch] = left - 1
            return False
        return True

    def plan(self, wants: dict[int, int]) -> dict[int, int]:
        """wants: seq_id -> drafts available (the proposer's count, or k for a draft model) for the decode
        rows of the coming step; -> seq_id -> drafts to verify (0 = plain decode)."""
        if not self.adaptive:
            return {s: min(n, self.k) for s, n in wants.items()}
        prefs = {s: self._preferred(s, n) for s, n in wants.items()}
        batch = len(wants)
        base = self.costs.measured(batch)
        if base is None or not any(prefs.values()):
            return dict.fromkeys(prefs, 0)  # a plain step first: its time is what speculation has to beat
        return self._worth_it(prefs, batch, base)

    def _worth_it(self, prefs: dict[int, int], batch: int, base: float) -> dict[int, int]:
        """Each sequence's drafts while a draft's expected tokens (alpha^j) are worth more than the query
        row costs (the step's marginal cost per token against a plain step's time per token); then the
        whole step must beat a plain one in expected tokens per second."""
        full = self.costs.estimate(batch + sum(prefs.values()))
        slope = max(0.0, (full - base) / sum(prefs.values()))
        per_token = base / batch
        ks = {s: _drafts_worth(self.seqs[s].alpha, k, slope / per_token) for s, k in prefs.items()}
        drafts = sum(ks.values())
        gain = sum(expected_accepted(self.seqs[s].alpha, k) for s, k in ks.items())
        if drafts and (batch + gain) / self.costs.estimate(batch + drafts) > batch / base:
            return ks
        if batch >= _REST_FROM:
            self.resting[batch] = _REST
        return dict.fromkeys(ks, 0)

    def _preferred(self, seq_id: int, available: int) -> int:
        state = self._state(seq_id)
        if state.skip > 0:
            state.skip -= 1
            return 0
        return min(available, self.k)

    def _state(self, seq_id: int) -> _SeqState:
        state = self.seqs.get(seq_id)
        if state is None:
            state = self.seqs[seq_id] = _SeqState(self.model_alpha)
        return state

    def observe(self, seq_id: int, num_drafts: int, num_accepted: int) -> None:
        """A verify row's outcome: num_accepted of its num_drafts drafts."""
        if num_drafts <= 0:
            return
        rate = num_accepted / num_drafts
        state = self._state(seq_id)
        state.alpha += _EMA * (rate - state.alpha)
        self.model_alpha += 0.05 * (rate - self.model_alpha)
        if self.adaptive and not self._pays_alone(state.alpha):
            state.skip, state.backoff = state.backoff, min(2 * state.backoff, _BACKOFF_MAX)
        elif rate > 0:
            state.backoff = _BACKOFF_MIN

    def observe_shadow(self, seq_id: int, hit: bool) -> None:
        """A proposal that was not verified (the sequence sat out, or the step did not pay), its first draft
        checked against the token the target chose: acceptance keeps being tracked for free, and a sequence
        sitting out comes back as soon as its text turns copyable."""
        state = self._state(seq_id)
        state.alpha += _SHADOW_EMA * (float(hit) - state.alpha)
        if state.skip and self._pays_alone(state.alpha):
            state.skip, state.backoff = 0, _BACKOFF_MIN

    def _pays_alone(self, alpha: float) -> bool:
        """Whether drafts at this acceptance beat a plain step at batch 1 for some k (unmeasured: assume so)."""
        one = self.costs.measured(1)
        if one is None:
            return alpha > 0.1
        for k in range(1, self.k + 1):
            cost = self.costs.estimate(1 + k)
            if cost is None or (1 + expected_accepted(alpha, k)) / cost > 1 / one:
                return True
        return False

    def record_step(self, num_tokens: int, seconds: float) -> None:
        self.costs.record(num_tokens, seconds)

    def forget(self, seq_id: int) -> None:
        self.seqs.pop(seq_id, None)

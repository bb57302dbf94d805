"""The rejection sampler keeps the target's distribution: chi-square tests on a 6-token vocabulary, for
draft-model proposals (any q) and n-gram point masses, with temperature, top-k and top-p applied, and the
greedy rule (accept while the argmax equals the draft)."""

import math

import pytest
import torch

from native_engine.sample import SamplingState
from native_engine.sampling_params import SamplingParams
from native_engine.spec_decode.rejection_sampler import RejectionSampler, VerifyRows

V, ROWS = 6, 20000


def chi2_critical(dof: int, z: float = 3.719) -> float:
    """Wilson-Hilferty: the chi-square quantile at the normal quantile z (3.719: p = 1e-4)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def assert_distributed(samples: list[int], p: torch.Tensor) -> None:
    assert len(samples) > 100, len(samples)
    counts = torch.bincount(torch.tensor(samples, dtype=torch.long), minlength=V).double()
    expected = p.double() * len(samples)
    keep = expected > 0
    assert counts[~keep].sum() == 0, f"drew tokens the target excludes: {counts.tolist()} vs {p.tolist()}"
    chi2 = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    assert chi2 < chi2_critical(int(keep.sum()) - 1), (chi2, counts.tolist(), expected.tolist())


def verify(params, logits, drafts, draft_probs=None, seed=0):
    """ROWS verify rows with the same k + 1 target logits; -> each row's output tokens and the target p."""
    state = SamplingState(V, 4, torch.device("cpu"), seed)
    slot = state.slot(("r", 0), params, [0], [])
    k = drafts.shape[1]
    meta = state.metadata([slot] * (ROWS * (k + 1)))
    sampler = RejectionSampler()
    rows = VerifyRows.build(drafts.tolist())
    out = sampler(logits.repeat(ROWS, 1), meta, rows, draft_probs, torch.Generator().manual_seed(seed))
    p = sampler.sampler.probs(logits.clone(), state.metadata([slot] * (k + 1)))
    return out, p


LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, 1.5],
                       [0.0, 2.5, 0.5, 1.0, -2.0, 0.3],
                       [1.0, 1.0, 1.0, 0.0, 0.0, 3.0]])
PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4),
          SamplingParams(temperature=1.3, top_p=0.8)]


@pytest.mark.parametrize("params", PARAMS, ids=["t1", "t0.7-topk4", "t1.3-topp0.8"])
def test_draft_model_proposals_keep_the_target_distribution(params):
    gen = torch.Generator().manual_seed(1)
    q = torch.tensor([[0.1, 0.4, 0.1, 0.2, 0.1, 0.1], [0.3, 0.1, 0.1, 0.1, 0.3, 0.1]])
    drafts = torch.stack([torch.multinomial(q[j], ROWS, replacement=True, generator=gen) for j in range(2)], 1)
    draft_probs = q.repeat(ROWS, 1)  # row i's two drafts were drawn from q_0, q_1
    out, p = verify(params, LOGITS, drafts, draft_probs)
    assert_distributed([o[0] for o in out], p[0])
    # the second token, in the rows that reached it, follows the target at position 1 (the target here does
    # not depend on the prefix, so its position-1 distribution is the same whatever token came first)
    assert_distributed([o[1] for o in out if len(o) > 1], p[1])
    assert_distributed([o[2] for o in out if len(o) > 2], p[2])


@pytest.mark.parametrize("params", PARAMS, ids=["t1", "t0.7-topk4", "t1.3-topp0.8"])
@pytest.mark.parametrize("draft", [0, 1, 3])
def test_ngram_point_masses_keep_the_target_distribution(params, draft):
    drafts = torch.full((ROWS, 2), draft)
    out, p = verify(params, LOGITS, drafts)
    assert_distributed([o[0] for o in out], p[0])
    accepted = sum(len(o) > 1 for o in out) / ROWS  # acceptance of a point mass at x: p(x)
    assert abs(accepted - float(p[0, draft])) < 4 * math.sqrt(0.25 / ROWS) + 1e-9
    if p[0, draft] > 0.05:
        assert_distributed([o[1] for o in out if len(o) > 1], p[1])


def test_greedy_accepts_while_the_argmax_matches():
    params = SamplingParams(temperature=0)
    argmax = LOGITS.argmax(-1).tolist()  # [0, 1, 5]
    drafts = torch.tensor([[argmax[0], argmax[1]], [argmax[0], 3], [2, argmax[1]]])
    state = SamplingState(V, 4, torch.device("cpu"))
    slot = state.slot(("r", 0), params, [0], [])
    out = RejectionSampler()(LOGITS.repeat(3, 1), state.metadata([slot] * 9), VerifyRows.build(drafts.tolist()))
    assert out == [[0, 1, 5], [0, 1], [0]]


def test_mixed_greedy_and_sampled_rows():
    state = SamplingState(V, 4, torch.device("cpu"))
    greedy = state.slot(("g", 0), SamplingParams(temperature=0), [0], [])
    sampled = state.slot(("s", 0), SamplingParams(temperature=1.0), [0], [])
    meta = state.metadata([greedy] * 3 + [sampled] * 2)
    out = RejectionSampler()(torch.cat([LOGITS, LOGITS[:2]]), meta, VerifyRows.build([[0, 1], [0]]),
                             generator=torch.Generator().manual_seed(0))
    assert out[0] == [0, 1, 5] and 1 <= len(out[1]) <= 2


def test_the_test_has_power():
    """Accepting every draft would give the drafts' distribution: the chi-square test rejects it."""
    q = torch.tensor([0.1, 0.4, 0.1, 0.2, 0.1, 0.1])
    drafts = torch.multinomial(q, ROWS, replacement=True, generator=torch.Generator().manual_seed(3)).tolist()
    p = torch.softmax(LOGITS[0], -1)
    with pytest.raises(AssertionError):
        assert_distributed(drafts, p)

"""The KL arithmetic against hand-computed cases (values worked out on paper, in the comments)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accuracy.divergence import MIN_TAIL, kl_buckets, kl_rows, log_softmax, share, summarize, tail_mass


def logs(*ps: float) -> list[float]:
    return [math.log(p) for p in ps]


def test_exact_kl_of_two_coins():
    # KL = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3) = 0.14384103622589045
    assert kl_rows(np.array(logs(0.5, 0.5)), np.array(logs(0.25, 0.75))) == pytest.approx(0.14384103622589045, rel=1e-12)


def test_exact_kl_is_not_symmetric():
    # KL(B‖A) = 0.25 ln(0.25/0.5) + 0.75 ln(0.75/0.5) = -0.25 ln 2 + 0.75 ln 1.5 = 0.130812035941137
    assert kl_rows(np.array(logs(0.25, 0.75)), np.array(logs(0.5, 0.5))) == pytest.approx(0.130812035941137, rel=1e-12)


def test_exact_kl_per_row_and_zero_mass_terms():
    a = np.array([logs(0.5, 0.5, 1e-300), [0.0, -math.inf, -math.inf]])
    b = np.array([logs(0.5, 0.5, 1e-300), logs(0.5, 0.25, 0.25)])
    # row 0: identical -> 0; row 1: A puts all mass on token 0: 1 * ln(1/0.5) = ln 2; 0·log 0 counts as 0
    assert kl_rows(a, b) == pytest.approx([0.0, math.log(2)], abs=1e-15)


def test_rows_of_different_vocabularies_are_refused():
    with pytest.raises(ValueError, match="shape"):
        kl_rows(np.zeros((2, 3)), np.zeros((2, 4)))


def test_log_softmax_of_logits():
    # logits (0, ln 3): probabilities 1/4 and 3/4
    assert np.exp(log_softmax(np.array([0.0, math.log(3)]))) == pytest.approx([0.25, 0.75])


def test_top_k_with_one_tail_bucket():
    # A: x 0.5, y 0.3 (tail 0.2); B: x 0.4, y 0.4 (tail 0.2)
    # KL = 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) + 0.2 ln(0.2/0.2) = 0.11157177565710485 - 0.08630462173553424
    assert kl_buckets(logs(0.5, 0.3), logs(0.4, 0.4)) == pytest.approx(0.025267153921570616, rel=1e-12)


def test_tail_bucket_carries_mass_the_top_k_leaves_out():
    # A: x 0.9 (tail 0.1); B: x 0.6 (tail 0.4): 0.9 ln(0.9/0.6) + 0.1 ln(0.1/0.4) = 0.36491 - 0.13863
    assert kl_buckets(logs(0.9), logs(0.6)) == pytest.approx(0.9 * math.log(1.5) + 0.1 * math.log(0.25), rel=1e-12)
    assert tail_mass(logs(0.9)) == pytest.approx(0.1)


def test_buckets_are_a_lower_bound_and_exact_when_they_hold_all_the_mass():
    p, q = [0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]
    exact = float(kl_rows(np.array(logs(*p)), np.array(logs(*q))))
    # exact = 0.4 ln 4 + 0.3 ln 1.5 + 0.2 ln(2/3) + 0.1 ln(1/4) = 0.45643...
    assert exact == pytest.approx(0.4 * math.log(4) + 0.3 * math.log(1.5) + 0.2 * math.log(2 / 3) + 0.1 * math.log(0.25))
    for k in range(1, 4):
        assert kl_buckets(logs(*p[:k]), logs(*q[:k])) <= exact + 1e-15
    assert kl_buckets(logs(*p), logs(*q)) == pytest.approx(exact, rel=1e-12)


def test_an_empty_tail_on_b_is_large_but_finite():
    # B lists x with p 1.0 (tail 0), A leaves 0.5 outside x: 0.5 ln(0.5/1) + 0.5 ln(0.5/MIN_TAIL)
    value = kl_buckets(logs(0.5), [0.0])
    assert value == pytest.approx(0.5 * math.log(0.5) + 0.5 * math.log(0.5 / MIN_TAIL))


def test_mismatched_lists_are_refused():
    with pytest.raises(ValueError):
        kl_buckets(logs(0.5), logs(0.5, 0.2))


def test_summary_statistics():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    # mean 2.5; sample std sqrt(5/3) = 1.2909944; standard error 1.2909944 / 2 = 0.6454972
    assert (s.count, s.mean, s.max, s.min, s.median) == (4, 2.5, 4.0, 1.0, 2.5)
    assert s.stderr == pytest.approx(math.sqrt(5 / 3) / 2)
    assert s.percentiles["90.0"] == pytest.approx(3.7)  # linear interpolation: 3 + 0.7 * (4 - 3)
    assert summarize([]) is None


def test_share_and_its_standard_error():
    # 9 of 10: 0.9 ± sqrt(0.9 * 0.1 / 10) = 0.0948683
    assert share(9, 10) == pytest.approx((0.9, 0.09486832980505137))

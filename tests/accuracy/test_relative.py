"""Per-position comparison of two distributions: exact rows, top-k with a full side, top-k on both,
agreement, Δp and the first divergence; token bytes shared by several ids."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accuracy.relative import PromptResult, compare_position, topk_kl
from accuracy.remote import _top
from accuracy.target import Dist, Piece, Vocab

VOCAB = Vocab([b"a", b"b", b"c", b"d"])


def row(*ps: float) -> np.ndarray:
    return np.log(np.array(ps, dtype=np.float64))


def test_exact_when_both_sides_have_rows_over_one_vocabulary():
    a = Dist.from_row(row(0.4, 0.3, 0.2, 0.1), VOCAB, k=2)
    b = Dist.from_row(row(0.1, 0.2, 0.3, 0.4), VOCAB, k=2)
    position = compare_position(0, Piece(0, b"a"), a, b)
    exact = 0.4 * math.log(4) + 0.3 * math.log(1.5) + 0.2 * math.log(2 / 3) + 0.1 * math.log(0.25)
    assert position.kl == pytest.approx(exact)
    # top-2 of each side, as an API returns them: A {a .4, b .3}, B {d .4, c .3}: no token in common,
    # so one bucket holds everything and the estimate is 0, far below the exact KL
    assert position.kl_topk == pytest.approx(0.0, abs=1e-15)
    assert (position.agree, position.b_token) == (False, "d")
    assert (position.p_a, position.p_b) == pytest.approx((0.4, 0.1))


def test_top_k_estimate_uses_every_token_a_full_side_knows():
    a = Dist.from_row(row(0.4, 0.3, 0.2, 0.1), VOCAB, k=2)
    b = Dist({b"a": math.log(0.5), b"c": math.log(0.25)}, greedy=b"a")  # a server's top-2
    # S = {a, b} from A's top-2 ∪ {a, c} from B's, known on both sides: {a, c}
    # 0.4 ln(0.4/0.5) + 0.2 ln(0.2/0.25) + 0.4 ln(0.4/0.25) = 0.4 ln 0.8 + 0.2 ln 0.8 + 0.4 ln 1.6
    expected = 0.6 * math.log(0.8) + 0.4 * math.log(1.6)
    assert topk_kl(a, b) == pytest.approx(expected)
    position = compare_position(3, Piece(0, b"a"), a, b)
    assert position.kl == position.kl_topk == pytest.approx(expected)
    assert position.agree is True and position.p_b == pytest.approx(0.5)


def test_two_servers_share_only_the_tokens_both_list():
    a = Dist({b"x": math.log(0.6), b"y": math.log(0.2)}, greedy=b"x")
    b = Dist({b"x": math.log(0.5), b"z": math.log(0.3)}, greedy=b"x")
    # S = {x}: 0.6 ln(0.6/0.5) + 0.4 ln(0.4/0.5)
    assert topk_kl(a, b) == pytest.approx(0.6 * math.log(1.2) + 0.4 * math.log(0.8))


def test_a_server_token_with_lost_bytes_leaves_agreement_unknown():
    b = _top([("\ufffd".encode(), -0.5), (b" the", -1.5)], "\ufffd".encode(), -0.5)
    assert b.top == {b" the": -1.5} and b.greedy is None
    position = compare_position(0, Piece(None, b" the"), Dist({b" the": -1.0}), b)
    assert position.agree is None and position.b_token is None


def test_bytes_listed_twice_with_different_logprobs_are_left_out():
    # llama.cpp's server prints a token cut in a UTF-8 character without its bytes: b" \xe8" becomes
    # " ", which another token spells too; a JSON object keeps one of them
    b = _top([(b" ", -2.0), (b" ", -3.0), (b"x", -1.0)], b"x", -1.0)
    assert b.top == {b"x": -1.0}


def test_ids_that_share_bytes_are_one_token_to_a_server():
    vocab = Vocab([b"a", b"b", b"a"])  # ids 0 and 2 are both "a"
    dist = Dist.from_row(row(0.5, 0.3, 0.2), vocab, k=3)
    assert dist.top == pytest.approx({b"a": math.log(0.7), b"b": math.log(0.3)})
    assert dist.logprob(b"a") == pytest.approx(math.log(0.7)) and vocab.id_of(b"a") is None


def test_first_divergence_is_the_first_position_b_would_choose_otherwise():
    vocab = Vocab([b"p", b"q"])
    a_rows = [row(0.9, 0.1), row(0.8, 0.2), row(0.3, 0.7)]
    b_rows = [row(0.8, 0.2), row(0.4, 0.6), row(0.3, 0.7)]
    pieces = [Piece(0, b"p"), Piece(0, b"p"), Piece(1, b"q")]
    positions = [compare_position(i, piece, Dist.from_row(x, vocab, 1), Dist.from_row(y, vocab, 1))
                 for i, (piece, x, y) in enumerate(zip(pieces, a_rows, b_rows))]
    first = PromptResult("prompt", "ppq", positions).first_divergence
    # at position 1: 0.8 ln(0.8/0.4) + 0.2 ln(0.2/0.6)
    assert (first.index, first.token, first.b_token) == (1, "p", "q")
    assert first.kl == pytest.approx(0.8 * math.log(2) + 0.2 * math.log(1 / 3))
    assert [p.agree for p in positions] == [True, False, True]


def test_no_distribution_from_b_is_not_compared():
    position = compare_position(0, Piece(None, b"x"), Dist({b"x": -0.1}), None)
    assert (position.kl, position.agree) == (None, None)

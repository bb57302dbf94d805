"""The batched sampler: vLLM's semantics, seeded rows independent of the batch, and the drawn distribution
checked by a chi-square test on a fixed small vocabulary; on CPU, and on CUDA (`gpu` mark) where there is one."""

import math

import numpy as np
import pytest
import torch

from native_engine.sample import Sampler, SamplingState, ops
from native_engine.sampling_params import SamplingParams

Params = SamplingParams
V = 50


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> torch.device:
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device(request.param)


def _state(vocab: int = V, seed: int = 0, device: torch.device = torch.device("cpu")) -> SamplingState:
    return SamplingState(vocab, 4, device, seed)


def _sample(state: SamplingState, logits: torch.Tensor, rows: list[tuple[str, SamplingParams]], prompt=(), output=()):
    slots = [state.slot((key, 0), p, list(prompt), list(output)) for key, p in rows]
    meta = state.metadata(slots)
    out = Sampler()(logits.to(state.device, copy=True), meta)  # the sampler may write into its logits
    state.update(meta, out.token_ids)
    return out.to_host()


def test_greedy_takes_the_argmax_and_reports_raw_logprobs(device):
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    [tok] = _sample(_state(4, device=device), logits, [("a", Params(temperature=0, logprobs=2))])
    assert tok.token_id == 1
    expected = torch.log_softmax(logits[0], -1)
    assert tok.logprob == pytest.approx(float(expected[1]))
    assert [t for t, _ in tok.top_logprobs] == [1, 3]
    assert [lp for _, lp in tok.top_logprobs] == pytest.approx([float(expected[1]), float(expected[3])])


def test_top_k_top_p_min_p_remove_the_tail():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda k, p, m: sorted(  # noqa: E731
        ids[0][probs[0] > 0].tolist() for probs, ids in [ops.top_k_top_p(
            logits, torch.ones(1), None if k == 4 else torch.tensor([k]), k, None if p == 1 else torch.tensor([p]),
            None if m == 0 else torch.tensor([m]))]
    )[0]
    assert sorted(kept(2, 1.0, 0.0)) == [0, 1]
    assert sorted(kept(4, 0.7, 0.0)) == [0, 1]
    probs, ids = ops.top_k_top_p(logits, torch.ones(1), None, 4, None, torch.tensor([0.2]))
    assert ids is None and probs[0].nonzero().flatten().tolist() == [0, 1, 2]


def test_penalties_follow_vllm_semantics(device):
    logits = torch.tensor([[2.0, -2.0, 1.0, 1.5]])
    rep = _sample(_state(4, device=device), logits, [("a", Params(temperature=0, repetition_penalty=4.0))], prompt=[0])[0]
    assert rep.token_id == 3  # 2.0 / 4 = 0.5 falls below 1.5
    freq = _sample(_state(4, device=device), logits, [("a", Params(temperature=0, frequency_penalty=0.3))], output=[0, 0])[0]
    assert freq.token_id == 3  # 2.0 - 0.6 = 1.4 < 1.5
    pres = _sample(_state(4, device=device), logits, [("a", Params(temperature=0, presence_penalty=0.4))], output=[0, 0])[0]
    assert pres.token_id == 0  # 2.0 - 0.4 = 1.6 > 1.5: presence counts once
    neg = _sample(_state(4, device=device), torch.tensor([[-1.0, -1.2, -5.0, -6.0]]),
                  [("a", Params(temperature=0, repetition_penalty=2.0))], prompt=[0])[0]
    assert neg.token_id == 1  # -1.0 * 2 = -2.0 falls below -1.2


def test_the_dense_penalties_of_the_gpu_equal_the_sparse_ones_of_the_cpu():
    torch.manual_seed(2)
    logits = torch.randn(3, V) * 4
    seen = torch.rand(3, V) < 0.2
    counts = torch.randint(0, 3, (3, V), dtype=torch.int32) * seen
    args = (seen, counts, torch.tensor([1.3, 1.0, 0.8]), torch.tensor([0.5, 0.0, -0.2]), torch.tensor([0.1, 0.7, 0.0]))
    dense = ops.penalties_dense(logits.clone(), *args)
    torch.testing.assert_close(ops.penalties_at_seen(logits.clone(), *args), dense, rtol=0, atol=0)
    assert not torch.equal(dense, logits)


def test_penalty_counts_grow_from_the_sampled_tokens_in_place(device):
    state = _state(4, device=device)
    params = Params(temperature=0, frequency_penalty=0.6)
    logits = torch.tensor([[2.0, 1.5, 0.0, -1.0]])
    tokens = [_sample(state, logits, [("a", params)])[0].token_id for _ in range(3)]
    assert tokens == [0, 1, 0]  # 2.0 - 0.6 = 1.4 < 1.5; then 1.4 > 1.5 - 0.6 = 0.9
    assert state.counts[state.slots[("a", 0)]].tolist() == [2, 1, 0, 0]
    state.release(("a", 0))
    assert state.slots == {} and len(state.free) == state.capacity


def test_a_seeded_row_draws_the_same_tokens_alone_and_in_any_batch(device):
    torch.manual_seed(0)
    steps = [torch.randn(4, V) * 3 for _ in range(40)]
    target = Params(temperature=0.9, top_k=20, top_p=0.95, seed=7)
    alone_state, batch_state = _state(device=device), _state(seed=123, device=device)
    others = [("b", Params(temperature=1.2, top_k=3)), ("c", Params(temperature=0)),
              ("d", Params(temperature=0.7, top_p=0.5, seed=1, repetition_penalty=1.3))]
    alone = [_sample(alone_state, logits[1:2], [("a", target)])[0].token_id for logits in steps]
    batched = [_sample(batch_state, logits, [others[0], ("a", target), *others[1:]])[1].token_id for logits in steps]
    assert batched == alone
    assert len(set(alone)) > 5  # it really samples


def _expected(logits: list[float], temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The reference distribution, written out: softmax(l / T) over the top k, then the top-p nucleus."""
    z = np.array(logits, dtype=np.float64) / temperature
    order = np.argsort(-z)[:top_k]
    p = np.exp(z[order] - z[order].max())
    p /= p.sum()
    keep = (np.cumsum(p) - p) <= top_p
    out = np.zeros(len(logits))
    out[order[keep]] = p[keep] / p[keep].sum()
    return out


CHI2_999 = {3: 16.27, 4: 18.47, 5: 20.52}  # chi-square critical values at p = 0.001, by degrees of freedom


@pytest.mark.parametrize("seeded", [False, True])
def test_draws_follow_the_distribution_chi_square(seeded, device):
    logits = [2.0, 1.6, 1.1, 0.4, 0.0, -1.0, -3.0, 0.9]
    params = dict(temperature=0.8, top_k=6, top_p=0.9)
    want = _expected(logits, **params)
    rows, calls = 2000, 10
    state = SamplingState(len(logits), rows, device, seed=5)
    slots = [state.slot((f"r{i}", 0), Params(**params, seed=i if seeded else None), [], []) for i in range(rows)]
    counts = np.zeros(len(logits))
    batch = torch.tensor([logits] * rows, device=device)
    for _ in range(calls):
        out = Sampler()(batch.clone(), state.metadata(slots))
        counts += np.bincount(out.token_ids.cpu().numpy(), minlength=len(logits))
    n = rows * calls
    assert counts[want == 0].sum() == 0  # filtered tokens are never drawn
    live = want > 0
    chi2 = float((((counts[live] - n * want[live]) ** 2) / (n * want[live])).sum())
    assert chi2 < CHI2_999[int(live.sum()) - 1], (counts / n, want)


def test_probs_is_the_distribution_the_rows_are_drawn_from():
    logits = torch.tensor([[2.0, 1.6, 1.1, 0.4, 0.0, -1.0, -3.0, 0.9], [0.0, 3.0, 1.0, 0, 0, 0, 0, 0]])
    state = SamplingState(8, 2, torch.device("cpu"))
    meta = state.metadata([state.slot(("a", 0), Params(temperature=0.8, top_k=6, top_p=0.9), [], []),
                           state.slot(("b", 0), Params(temperature=0), [], [])])
    probs = Sampler().probs(logits, meta)
    assert probs[0].numpy() == pytest.approx(_expected(logits[0].tolist(), 0.8, 6, 0.9), abs=1e-6)
    assert probs[1].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("scale", [4.0, 0.05])  # peaked: the nucleus inside the top 256 candidates; flat: a sort
def test_top_p_without_top_k_on_a_large_vocabulary_is_exact(scale):
    vocab = 3000
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(3)) * scale
    state = SamplingState(vocab, 4, torch.device("cpu"))
    params = [Params(temperature=0.9, top_p=0.8), Params(temperature=0.7, top_k=50, top_p=0.95), Params(temperature=0)]
    meta = state.metadata([state.slot((f"r{i}", 0), p, [], []) for i, p in enumerate(params)])
    probs = Sampler().probs(logits, meta)
    assert probs[0].numpy() == pytest.approx(_expected(logits[0].tolist(), 0.9, vocab, 0.8), abs=1e-6)
    assert probs[1].numpy() == pytest.approx(_expected(logits[1].tolist(), 0.7, 50, 0.95), abs=1e-6)
    *_, mass = ops._sorted_candidates(logits, meta.temperature, meta.top_k, meta.top_p, meta.greedy)
    assert (mass is not None) == (scale > 1)  # the short path when it is exact, the sort otherwise


def test_a_bitmask_leaves_only_the_allowed_tokens(device):
    logits = torch.zeros(2, 40, device=device)
    logits[:, 5] = 10.0
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 1] = (1 << 1) | (1 << 3) | -(1 << 31)  # tokens 33, 35 and 63 (past the vocabulary: ignored)
    ops.apply_token_bitmask(logits, torch.tensor([1], device=device), bitmask.to(device))
    assert logits[0, 5] == 10.0 and torch.isinf(logits[1]).sum() == 38
    assert logits[1].isfinite().nonzero().flatten().tolist() == [33, 35]


def test_the_gpus_bitmask_unpacking_equals_the_cpus():
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 5), dtype=torch.int32)
    torch.testing.assert_close(ops.banned_torch(bitmask, 150), ops.banned_numpy(bitmask, 150))
    assert ops.banned_numpy(bitmask, 150).shape == (3, 150)


def test_min_p_and_top_k_one_equal_greedy_under_any_temperature():
    torch.manual_seed(1)
    logits = torch.randn(6, V)
    greedy = logits.argmax(-1).tolist()
    rows = [(f"r{i}", Params(temperature=2.0, top_k=1)) for i in range(3)]
    rows += [(f"m{i}", Params(temperature=0.5, min_p=1.0)) for i in range(3)]
    assert [t.token_id for t in _sample(SamplingState(V, 6, torch.device("cpu")), logits, rows)] == greedy
    assert not math.isnan(logits.sum())

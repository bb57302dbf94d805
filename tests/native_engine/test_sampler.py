import pytest
import torch

from native_engine.layers.sampler import Sampler, SamplingRow, filter_logits
from native_engine.sampling_params import SamplingParams


Params = SamplingParams


def _row(params, seed=None, prompt=(), output=()):
    gen = None
    if params.temperature:
        gen = torch.Generator().manual_seed(seed or 0)
    return SamplingRow(params, gen, list(prompt), list(output))


def test_greedy_takes_the_argmax_and_reports_raw_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    [tok] = Sampler()(logits, [_row(Params(temperature=0, logprobs=2))])
    assert tok.token_id == 1
    expected = torch.log_softmax(logits[0], -1)
    assert tok.logprob == pytest.approx(float(expected[1]))
    assert [t for t, _ in tok.top_logprobs] == [1, 3]


def test_top_k_top_p_min_p_remove_the_tail():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert filter_logits(logits, 2, 1.0, 0.0).nonzero().flatten().tolist() == [0, 1]
    assert filter_logits(logits, 0, 0.7, 0.0).nonzero().flatten().tolist() == [0, 1]
    assert filter_logits(logits, 0, 1.0, 0.2).nonzero().flatten().tolist() == [0, 1, 2]


def test_same_seed_same_tokens_whatever_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    alone = Sampler()(logits[1:2], [_row(Params(), seed=7)])[0].token_id
    batch = Sampler()(logits, [_row(Params(), seed=1), _row(Params(), seed=7), _row(Params(temperature=0))])
    assert batch[1].token_id == alone


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    row = _row(Params(), seed=3)
    counts = torch.zeros(3)
    for _ in range(2000):
        counts[Sampler()(probs.log()[None], [row])[0].token_id] += 1
    assert torch.allclose(counts / 2000, probs, atol=0.04)


def test_penalties_follow_vllm_semantics():
    logits = torch.tensor([[2.0, -2.0, 1.0, 1.5]])
    rep = Sampler()(logits, [_row(Params(temperature=0, repetition_penalty=4.0), prompt=[0])])[0]
    assert rep.token_id == 3  # 2.0 / 4 = 0.5 falls below 1.5
    freq = Sampler()(logits, [_row(Params(temperature=0, frequency_penalty=0.3), output=[0, 0])])[0]
    assert freq.token_id == 3  # 2.0 - 0.6 = 1.4 < 1.5
    pres = Sampler()(logits, [_row(Params(temperature=0, presence_penalty=0.4), output=[0, 0])])[0]
    assert pres.token_id == 0  # 2.0 - 0.4 = 1.6 > 1.5: presence counts once

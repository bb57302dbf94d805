"""The sampler's fused kernels against the torch ops they replace, and the sampler with them switched on (CPU
tensors through TRITON_INTERPRET here; CUDA with the gpu mark): the same tokens for the same noise."""

import pytest
import torch

from native_engine.kernels import sampling
from native_engine.sample import Sampler, SamplingState, ops
from native_engine.sample import sampler as sampler_module
from native_engine.sampling_params import SamplingParams as Params
from tests.native_engine.kernels.helpers import on_gpu_only_if


def _columns(rows: int, device: str, *values) -> list[torch.Tensor]:
    """Per-row parameters as strided columns of one float32 table, as SamplingState hands them over."""
    table = torch.tensor([list(values)] * rows, dtype=torch.float32, device=device)
    table[:, 0] += torch.arange(rows, device=device) * 0.05
    return [table[:, i] for i in range(len(values))]


@pytest.mark.parametrize(("rep", "counted"), [(True, False), (False, True), (True, True)])
def test_penalties_kernel_equals_the_dense_ops(device, rep, counted):
    on_gpu_only_if(device, rep)
    gen = torch.Generator().manual_seed(4)
    logits = (torch.randn(3, 700, generator=gen) * 3).to(device)
    seen = (torch.rand(3, 700, generator=gen) < 0.3).to(device)
    counts = (torch.randint(0, 4, (3, 700), generator=gen, dtype=torch.int32) * seen.cpu()).to(device)
    r, p, f = _columns(3, device, 1.3, 0.4, 0.25)
    args = (seen, counts if counted else None, r if rep else None, p if counted else None, f if counted else None)
    expected = ops.penalties_dense(logits.clone(), *args)
    got = sampling.penalties_triton(logits, *args)
    assert got.data_ptr() == logits.data_ptr()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def _candidates(rows: int, k: int, device: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    values = (torch.randn(rows, k, generator=gen) * 2).sort(dim=-1, descending=True).values.to(device)
    ids = torch.stack([torch.randperm(5000, generator=gen)[:k] for _ in range(rows)]).to(device)
    q = torch.empty(rows, k).exponential_(generator=gen).to(device)
    return values, ids, q


def sample_candidates_ref(values: torch.Tensor, ids: torch.Tensor, q: torch.Tensor, temperature: torch.Tensor,
                          top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                          min_p: torch.Tensor | None) -> torch.Tensor:
    """The torch ops the kernel replaces (`ops.top_k_top_p` after its top-k, then `ops.exponential_race`)."""
    values = values / temperature[:, None]
    if top_k is not None:
        cut = torch.arange(values.shape[1], device=values.device)[None, :] >= top_k[:, None]
        values = values.masked_fill(cut, float("-inf"))
    probs = values.softmax(dim=-1)
    if top_p is not None:
        probs = probs.masked_fill(probs.cumsum(dim=-1) - probs > top_p[:, None], 0.0)
    if min_p is not None:
        probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
    return ops.exponential_race(probs, ids, q.clamp_min(sampling._TINY))


@pytest.mark.parametrize("k", [1, 40, 50, 300])
@pytest.mark.parametrize(("top_k", "top_p", "min_p"), [(False, False, False), (True, True, False), (False, True, True),
                                                      (True, False, True)])
def test_candidates_kernel_draws_what_the_torch_ops_draw(device, k, top_k, top_p, min_p):
    on_gpu_only_if(device, k == 40 and top_k and top_p or k == 1 and not (top_k or top_p or min_p))
    rows = 6
    values, ids, q = _candidates(rows, k, device, seed=k)
    temp, p, m = _columns(rows, device, 0.8, 0.9, 0.05)
    kk = torch.tensor([max(1, k - 3 * i) for i in range(rows)], device=device) if top_k else None
    args = (temp, kk, p if top_p else None, m if min_p else None)
    expected = sample_candidates_ref(values, ids, q, *args)
    assert torch.equal(sampling.sample_candidates_triton(values, ids, q, *args), expected)


@pytest.fixture
def fused(monkeypatch):
    """The sampler's CUDA path (fused kernels) on whatever device the tensors are on."""
    monkeypatch.setattr(sampler_module, "fused_sampling", lambda x: True)
    monkeypatch.setattr(ops, "fused_sampling", lambda x: True)


def _draws(state: SamplingState, rows, steps, device):
    slots = [state.slot((key, 0), p, [1, 2], []) for key, p in rows]
    out = []
    for logits in steps:
        meta = state.metadata(slots)
        tokens = Sampler()(logits.to(device, copy=True), meta).token_ids
        state.update(meta, tokens)
        out.append(tokens.tolist())
    return out


def test_the_sampler_with_fused_kernels_draws_the_unfused_tokens(device, monkeypatch):
    gen = torch.Generator().manual_seed(9)
    vocab = 300
    steps = [torch.randn(4, vocab, generator=gen) * 3 for _ in range(6)]
    rows = [("a", Params(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)),
            ("b", Params(temperature=0)), ("c", Params(temperature=1.1, top_k=20, min_p=0.05, seed=3)),
            ("d", Params(temperature=0.7, top_k=40, frequency_penalty=0.5, presence_penalty=0.3, seed=4))]
    unfused = _draws(SamplingState(vocab, 4, torch.device(device), seed=1), rows, steps, device)
    monkeypatch.setattr(sampler_module, "fused_sampling", lambda x: True)
    monkeypatch.setattr(ops, "fused_sampling", lambda x: True)
    assert _draws(SamplingState(vocab, 4, torch.device(device), seed=1), rows, steps, device) == unfused


def test_fused_seeded_rows_draw_the_same_alone_and_in_a_batch(device, fused):
    gen = torch.Generator().manual_seed(5)
    steps = [torch.randn(3, 200, generator=gen) * 3 for _ in range(8)]
    target = ("a", Params(temperature=0.9, top_k=30, top_p=0.95, seed=7))
    alone = _draws(SamplingState(200, 4, torch.device(device), seed=11), [target], [s[1:2] for s in steps], device)
    others = [("b", Params(temperature=1.2, top_k=3)), ("c", Params(temperature=0))]
    batch = _draws(SamplingState(200, 4, torch.device(device), seed=12), [others[0], target, others[1]], steps, device)
    assert [row[1] for row in batch] == [row[0] for row in alone]
    assert len({row[0] for row in alone}) > 2

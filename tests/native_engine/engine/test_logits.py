"""Our logits match transformers and llama.cpp on the same weights, on the plain and the paged path."""

from __future__ import annotations

import pytest
import torch

from .conftest import new_engine
from .helpers import assert_all_blocks_free, greedy, kl_per_position

KL_LIMIT = 1e-4
LOGPROB_ATOL = 1e-4
MAXIMA: dict[tuple[str, str], float] = {}  # (preset, measure) -> largest value seen; printed with -s


@pytest.fixture(scope="module", autouse=True)
def _report_maxima():
    yield
    for (preset, what), value in sorted(MAXIMA.items()):
        print(f"\n{preset:>10}  max {what:<44} {value:.3e}", end="")
    print()
    MAXIMA.clear()


def _record(model, what: str, value: float) -> None:
    key = (model.name, what)
    MAXIMA[key] = max(MAXIMA.get(key, 0.0), value)


def _check_kl(model, what: str, reference: torch.Tensor, ours: torch.Tensor) -> None:
    assert reference.shape == ours.shape
    kl = kl_per_position(reference, ours)
    _record(model, f"KL {what}", kl.max().item())
    assert kl.max().item() < KL_LIMIT, f"{what}: KL per position {kl.tolist()}"


@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_score_matches_transformers(model, prompts, hf_logits, source):
    engine = new_engine(model, source=source)
    for ids in prompts([1, 7, 40, 200], seed=2):
        _check_kl(model, f"score[{source}] vs hf", hf_logits(ids), engine.score(ids))


def test_score_matches_llama_cpp(model, engine, prompts, llama_cpp_logits):
    for ids in prompts([1, 7, 40, 200], seed=2):
        _check_kl(model, "score vs llama.cpp", llama_cpp_logits(ids), engine.score(ids))


def test_hf_and_gguf_checkpoints_give_the_same_logits(model, engine, prompts):
    ids = prompts([50], seed=3)[0]
    torch.testing.assert_close(new_engine(model, source="hf").score(ids), engine.score(ids), rtol=0, atol=1e-5)


def _check_logprobs(model, what: str, logprob, reference_logits: torch.Tensor) -> None:
    ref = reference_logits.double().log_softmax(-1)
    assert logprob.token_id == int(ref.argmax())
    top_values, top_ids = ref.topk(len(logprob.top_logprobs))
    assert len(top_ids) == 5 and [t for t, _ in logprob.top_logprobs] == top_ids.tolist()
    ours = torch.tensor([logprob.logprob] + [v for _, v in logprob.top_logprobs], dtype=torch.double)
    error = (ours - torch.cat([ref[logprob.token_id].reshape(1), top_values])).abs().max().item()
    _record(model, f"|logprob diff| {what}", error)
    assert error < LOGPROB_ATOL


@pytest.mark.parametrize("reference", ["hf", "llama.cpp"])
def test_chunked_paged_prefill_logprobs_match_reference(model, make_engine, prompts, request, reference):
    """A 45-token prompt through generate() with a 16-token budget and 8-token blocks: 3 chunks over 6 blocks."""
    ref_logits = request.getfixturevalue("hf_logits" if reference == "hf" else "llama_cpp_logits")
    engine = make_engine(block_size=8, max_num_batched_tokens=16)
    ids = prompts([45], seed=4)[0]
    out = engine.generate([ids], greedy(1, logprobs=5))[0].outputs[0]
    assert len(out.token_ids) == len(out.logprobs) == 1
    _check_logprobs(model, f"chunked prefill vs {reference}", out.logprobs[0], ref_logits(ids)[-1])
    assert_all_blocks_free(engine)


def test_paged_decode_logprobs_match_transformers(model, make_engine, prompts, hf_logits):
    """Every decode step's distribution (paged KV, decode kernel) against transformers on the whole sequence."""
    engine = make_engine(block_size=8, max_num_batched_tokens=16)
    batch = prompts([13, 30], seed=5)
    outputs = engine.generate(batch, greedy(20, logprobs=5))
    for ids, out in zip(batch, outputs, strict=True):
        completion = out.outputs[0]
        reference = hf_logits(ids + completion.token_ids)
        for step, logprob in enumerate(completion.logprobs):
            _check_logprobs(model, "paged decode vs hf", logprob, reference[len(ids) - 1 + step])

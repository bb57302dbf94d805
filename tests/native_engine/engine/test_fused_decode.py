"""`EngineConfig.fused_decode` on the CPU: steps of at most four tokens through `LlamaDecoderLayer.forward_fused`
(the norms, SiLU-and-mul and residual adds folded into the GEMVs; here `fused_gemv`'s torch reference, its Triton
kernel in tests/native_engine/kernels) give the module path's tokens; longer steps keep the module path. The
C decode stack is switched off so the module path runs every step."""

from __future__ import annotations

import torch

from .helpers import greedy, module_path, on_cuda_path, seeded, token_ids


def test_fused_decode_gives_the_module_paths_tokens(make_engine, prompts, monkeypatch):
    batch = prompts([5, 21, 3, 9], seed=62)
    params = [greedy(12), greedy(12), seeded(12, seed=2, top_k=40), greedy(6)]
    expected = token_ids(module_path(make_engine()).generate(batch, params))
    calls = on_cuda_path(monkeypatch, "fused_gemv")  # the attention block too (torch references)
    engine = module_path(make_engine(max_num_seqs=2), fused_decode=True)  # decode steps of 1-2 rows: fused
    assert token_ids(engine.generate(batch, params)) == expected
    rows = [len(args[0]) for args in calls]
    assert len(rows) > 4 * 20 and max(rows) <= 2  # four GEMVs a layer, every decode step, never a long prefill


def test_fused_decode_is_chosen_only_where_every_layer_can_run_it(make_engine):
    model = make_engine().model_runner.model.model
    assert not model.use_fused_decode(torch.device("cpu"))
    assert model.use_fused_decode(torch.device("cuda"))  # dense, unsharded weights: the check alone, no launch
    model.layers[0].mlp.down_proj.bias = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
    assert not model.use_fused_decode(torch.device("cuda"))  # a bias the epilogue leaves out

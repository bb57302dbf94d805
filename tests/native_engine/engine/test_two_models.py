"""Two native models served at once in one process (one engine thread each, as two in-process runners of
`infer run --local` step them) give exactly the tokens each gives when served alone: no forward state is shared."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from native_engine import AsyncLLMEngine
from registry.modelbuilder import PRESETS, build_gguf

from .conftest import BuiltModel, new_engine
from .helpers import greedy, token_ids

NUM_REQUESTS = 12


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuiltModel, BuiltModel]:
    """Different architectures and shapes, so a batch read by the wrong model fails loudly or drifts."""
    root: Path = tmp_path_factory.mktemp("two-models")
    built = []
    for name in ("tiny-qwen2", "tiny-llama"):
        spec = PRESETS[name]
        built.append(BuiltModel(name, spec, build_gguf(root / f"{name}.gguf", spec, dtype="f32"), root))
    return built[0], built[1]


def _prompts(model: BuiltModel, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [rng.choices(range(16, model.spec.vocab_size), k=rng.randint(3, 70)) for _ in range(NUM_REQUESTS)]


async def _serve(engine: AsyncLLMEngine, name: str, prompts: list[list[int]]) -> list[list[int]]:
    async def one(i: int, prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        async for out in engine.generate(f"{name}-{i}", prompt, greedy(12 + i % 5)):
            tokens += out.outputs[0].token_ids
        return tokens

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def test_two_models_served_concurrently_match_sequential(two_models):
    prompts = {m.name: _prompts(m, seed) for seed, m in enumerate(two_models)}
    expected = {m.name: [token_ids(new_engine(m, block_size=b).generate([p], greedy(12 + i % 5)))[0]
                         for i, p in enumerate(prompts[m.name])]
                for m, b in zip(two_models, (16, 8))}
    engines = {m.name: AsyncLLMEngine(new_engine(m, block_size=b)) for m, b in zip(two_models, (16, 8))}

    async def both() -> dict[str, list[list[int]]]:
        results = await asyncio.gather(*(_serve(e, name, prompts[name]) for name, e in engines.items()))
        return dict(zip(engines, results))

    try:
        for _ in range(3):  # several rounds: interleavings differ from run to run
            assert asyncio.run(both()) == expected
    finally:
        for e in engines.values():
            e.shutdown()

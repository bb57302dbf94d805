"""The deterministic test-model builder: real files, loaded by llama.cpp and transformers."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_torch
from typer.testing import CliRunner

from cli.dev import app as dev_app
from registry.modelbuilder import PRESETS, ModelSpec, build_gguf, build_hf, train_tokenizer
from registry.modelbuilder.tokenizer import CHATML_TEMPLATE, padded_tokenizer
from registry.modelbuilder.weights import iter_tensors, parameter_count

PROMPT = "The lighthouse keeper opened the ledger and wrote: 1234 ships, café, 中文 😀."
TEXTS = [
    "Hello world!",
    "",
    "  leading spaces,   runs of    spaces\t\ttabs\n\n\nnewlines  \n trailing   ",
    "Numbers: 12345 3.14159 -273.15 1e-3 2024-03-14 +44 20 7946 0958",
    "Café naïve façade Über straße ñandú Łódź ελληνικά русский",
    "中文：清晨的公园里，老人们在打太极拳。日本語のテキスト。한국어 텍스트",
    "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🇯🇵 ❤️ ∑∫√∞ ＡＢＣ１２３",
    "don't I'LL you've WE'RE she's they'd",
    "def f(x):\n    return x ** 2  # comment\n\tindented = {'a': [1, 2]}\n",
    "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>tail<|extra_3|>text",
]


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def ggufs(out_dir: Path) -> dict[tuple[str, str], Path]:
    jobs = [("tiny-qwen2", "f32"), ("tiny-qwen2", "f16"), ("tiny-qwen2", "q8_0"), ("tiny-llama", "f32")]
    return {(p, d): build_gguf(out_dir / f"{p}.{d}.gguf", PRESETS[p], dtype=d, seed=0) for p, d in jobs}


@pytest.fixture(scope="module")
def hf_dirs(out_dir: Path) -> dict[str, Path]:
    return {p: build_hf(out_dir / f"{p}-hf", PRESETS[p], seed=0) for p in ("tiny-qwen2", "tiny-llama")}


@pytest.fixture(scope="module")
def llamas(ggufs: dict[tuple[str, str], Path]) -> dict[tuple[str, str], llama_cpp.Llama]:
    # F32 KV cache so llama.cpp's numbers are comparable with transformers in float32.
    return {
        key: llama_cpp.Llama(
            model_path=str(path), n_ctx=256, verbose=False, seed=0, logits_all=True, type_k=0, type_v=0, n_threads=2
        )
        for key, path in ggufs.items()
    }


@pytest.fixture(scope="module")
def hf_models(hf_dirs: dict[str, Path]) -> dict[str, transformers.PreTrainedModel]:
    torch.manual_seed(0)
    load = transformers.AutoModelForCausalLM.from_pretrained
    return {p: load(d, dtype=torch.float32).eval() for p, d in hf_dirs.items()}


def _llama_logits(llm: llama_cpp.Llama, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: llm.n_tokens], dtype=np.float32)


def _llama_greedy(llm: llama_cpp.Llama, ids: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(ids)
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(out[-1:])
    return out


def _hf_logits(model: transformers.PreTrainedModel, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _hf_greedy(model: transformers.PreTrainedModel, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(np.argmax(_hf_logits(model, seq)[-1])))
    return seq[len(ids) :]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------ determinism


def test_tokenizer_training_is_deterministic_across_processes() -> None:
    code = "from registry.modelbuilder import train_tokenizer; print(train_tokenizer().to_str())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    tok = train_tokenizer()
    assert other.rstrip("\n") == tok.to_str()
    assert tok.get_vocab_size() == 1000
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [997, 998, 999]


def test_gguf_is_byte_identical_for_same_seed(tmp_path: Path, ggufs: dict[tuple[str, str], Path]) -> None:
    for preset, dtype in [("tiny-qwen2", "q8_0"), ("tiny-llama", "f32")]:
        again = build_gguf(tmp_path / f"{preset}.{dtype}.gguf", PRESETS[preset], dtype=dtype, seed=0)
        assert again.read_bytes() == ggufs[(preset, dtype)].read_bytes()
    other_seed = build_gguf(tmp_path / "seed1.gguf", PRESETS["tiny-llama"], dtype="f32", seed=1)
    assert _sha(other_seed) != _sha(ggufs[("tiny-llama", "f32")])


def test_hf_is_byte_identical_for_same_seed(tmp_path: Path, hf_dirs: dict[str, Path]) -> None:
    again = build_hf(tmp_path / "again", PRESETS["tiny-qwen2"], seed=0)
    names = sorted(p.name for p in again.iterdir())
    assert names == sorted(p.name for p in hf_dirs["tiny-qwen2"].iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    for name in names:
        assert (again / name).read_bytes() == (hf_dirs["tiny-qwen2"] / name).read_bytes(), name


# --------------------------------------------------------------- GGUF


def test_gguf_metadata_reads_back(ggufs: dict[tuple[str, str], Path]) -> None:
    reader = gguf.GGUFReader(ggufs[("tiny-qwen2", "q8_0")])

    def field(key: str):
        return reader.get_field(key).contents()

    spec = PRESETS["tiny-qwen2"]
    assert field("general.architecture") == "qwen2"
    assert field("general.name") == "tiny-qwen2"
    assert field("general.license") == "apache-2.0"
    assert field("general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    assert field("qwen2.context_length") == spec.context_length
    assert field("qwen2.attention.head_count_kv") == 2
    assert field("tokenizer.chat_template") == CHATML_TEMPLATE
    assert field("tokenizer.ggml.model") == "gpt2"
    assert field("tokenizer.ggml.pre") == "qwen2"
    assert len(field("tokenizer.ggml.tokens")) == spec.vocab_size
    assert field("tokenizer.ggml.tokens")[-1] == "<|extra_23|>"
    types = field("tokenizer.ggml.token_type")
    assert (types[0], types[997], types[999], types[1000]) == (1, 3, 3, 4)  # normal, control, control, user-defined
    assert (field("tokenizer.ggml.eos_token_id"), field("tokenizer.ggml.add_bos_token")) == (999, False)
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert "output.weight" not in types  # tied embeddings
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_q.bias"] == types["blk.1.ffn_norm.weight"] == gguf.GGMLQuantizationType.F32

    llama = gguf.GGUFReader(ggufs[("tiny-llama", "f32")])
    llama_types = {t.name: t.tensor_type for t in llama.tensors}
    assert llama.get_field("general.architecture").contents() == "llama"
    assert "output.weight" in llama_types and "blk.0.attn_q.bias" not in llama_types


def test_gguf_runs_in_llama_cpp(llamas: dict[tuple[str, str], llama_cpp.Llama]) -> None:
    llm = llamas[("tiny-qwen2", "f32")]
    ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
    logits = _llama_logits(llm, ids)
    assert llm.n_vocab() == 1024 and logits.shape == (len(ids), 1024)
    assert np.isfinite(logits).all() and logits.std() > 0.01
    llm.reset()
    generated = [t for _, t in zip(range(8), llm.generate(ids, temp=0.0, reset=True))]
    assert len(generated) == 8 and all(0 <= t < 1024 for t in generated)
    assert len(set(generated)) > 1  # not a degenerate single-token loop


@pytest.mark.parametrize("dtype, tolerance", [("f16", 5e-3), ("q8_0", 5e-2)])
def test_low_precision_gguf_stays_close_to_f32(
    llamas: dict[tuple[str, str], llama_cpp.Llama], dtype: str, tolerance: float
) -> None:
    ids = llamas[("tiny-qwen2", "f32")].tokenize(PROMPT.encode(), add_bos=False)
    reference = _llama_logits(llamas[("tiny-qwen2", "f32")], ids)
    logits = _llama_logits(llamas[("tiny-qwen2", dtype)], ids)
    assert 0 < np.abs(logits - reference).max() < tolerance
    assert len(_llama_greedy(llamas[("tiny-qwen2", dtype)], ids, 4)) == 4


@pytest.mark.parametrize("text", TEXTS)
def test_llama_cpp_tokenizes_like_tokenizers(llamas: dict[tuple[str, str], llama_cpp.Llama], text: str) -> None:
    assert unicodedata.is_normalized("NFC", text)  # Qwen2 style: HF normalizes to NFC, llama.cpp does not
    expected = padded_tokenizer(1024).encode(text).ids
    for key in [("tiny-qwen2", "f32"), ("tiny-llama", "f32")]:
        llm = llamas[key]
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == expected
        assert llm.detokenize(expected, special=True) == text.encode()


def test_padding_tokens_are_plain_added_tokens(llamas: dict[tuple[str, str], llama_cpp.Llama]) -> None:
    llm, tok = llamas[("tiny-qwen2", "f32")], padded_tokenizer(1024)
    ids = llm.tokenize(b"a<|extra_7|>b", add_bos=False, special=False)
    assert ids == tok.encode("a<|extra_7|>b").ids and 1007 in ids
    assert llm.detokenize([1007], special=False) == b"<|extra_7|>" == tok.decode([1007]).encode()


def test_llama_cpp_tokenizes_the_whole_corpus_like_tokenizers(llamas: dict[tuple[str, str], llama_cpp.Llama]) -> None:
    from registry.modelbuilder.tokenizer import corpus_text

    text = corpus_text()
    assert llamas[("tiny-qwen2", "f32")].tokenize(text.encode(), add_bos=False) == train_tokenizer().encode(text).ids


# ----------------------------------------------------------- transformers


def test_hf_loads_in_transformers(hf_dirs: dict[str, Path], hf_models: dict[str, transformers.PreTrainedModel]) -> None:
    path = hf_dirs["tiny-qwen2"]
    model = hf_models["tiny-qwen2"]
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert type(hf_models["tiny-llama"]).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == 1024 and model.config.tie_word_embeddings
    assert model.num_parameters() == parameter_count(PRESETS["tiny-qwen2"])
    tok = transformers.AutoTokenizer.from_pretrained(path)
    assert (tok.eos_token, tok.pad_token, len(tok)) == ("<|im_end|>", "<|endoftext|>", 1024)
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    for text in TEXTS:
        assert tok(text)["input_ids"] == fast(text)["input_ids"] == padded_tokenizer(1024).encode(text).ids
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 6)


def test_safetensors_hold_the_generated_weights(tmp_path: Path, hf_dirs: dict[str, Path]) -> None:
    spec = PRESETS["tiny-llama"]
    stored = load_file(hf_dirs["tiny-llama"] / "model.safetensors")
    expected = dict(iter_tensors(spec, 0))
    assert stored.keys() == expected.keys()
    assert all(np.array_equal(stored[k], v) for k, v in expected.items())
    bf16 = load_torch(build_hf(tmp_path / "bf16", spec, dtype="bf16") / "model.safetensors")
    assert all(torch.equal(bf16[k], torch.from_numpy(v).to(torch.bfloat16)) for k, v in expected.items())
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["architectures"] == ["LlamaForCausalLM"]


# ------------------------------------------------------ same model, both


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-llama"])
def test_gguf_and_hf_compute_the_same_model(
    preset: str,
    llamas: dict[tuple[str, str], llama_cpp.Llama],
    hf_models: dict[str, transformers.PreTrainedModel],
) -> None:
    llm, model = llamas[(preset, "f32")], hf_models[preset]
    ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
    llama_logits, hf_logits = _llama_logits(llm, ids), _hf_logits(model, ids)
    assert llama_logits.shape == hf_logits.shape == (len(ids), 1024)
    assert np.abs(llama_logits - hf_logits).max() < 1e-3
    greedy = _llama_greedy(llm, ids, 16)
    assert greedy == _hf_greedy(model, ids, 16)
    assert len(set(greedy)) > 1


# ------------------------------------------------------------- spec, CLI


def test_presets_and_spec_validation() -> None:
    assert parameter_count(PRESETS["qwen2-0.5b"]) == 494_032_768  # Qwen2-0.5B's parameter count
    assert parameter_count(PRESETS["qwen2-7b"]) == 7_615_616_512  # Qwen2-7B's
    assert PRESETS["tiny-llama"].num_kv_heads == PRESETS["tiny-llama"].num_heads
    with pytest.raises(ValueError, match="divisible"):
        ModelSpec(hidden_size=60, num_heads=7)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelSpec(num_kv_heads=3)
    with pytest.raises(ValueError, match="qwen2 always has"):
        ModelSpec(qkv_bias=False)
    with pytest.raises(ValueError, match="unsupported dtype"):
        build_gguf(Path("unused.gguf"), PRESETS["tiny-qwen2"], dtype="q5_k")


def test_cli_make_model_writes_files(tmp_path: Path) -> None:
    runner = CliRunner()
    target = tmp_path / "m.gguf"
    result = runner.invoke(dev_app, ["make-model", "--preset", "tiny-llama", "--dtype", "q8_0", "--out", str(target)])
    assert result.exit_code == 0, result.output
    assert str(target) in result.output and "KiB" in result.output
    assert gguf.GGUFReader(target).get_field("general.file_type").contents() == gguf.LlamaFileType.MOSTLY_Q8_0

    result = runner.invoke(dev_app, ["make-model", "--format", "hf", "--dtype", "f16", "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hf" / "model.safetensors").stat().st_size > 0 and "total" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "nope"], "'nope' is not one of"),
        (["--format", "hf", "--dtype", "q8_0"], "'q8_0' is not one of"),
        (["--format", "onnx"], "'onnx' is not one of"),
    ],
)
def test_cli_rejects_bad_options_without_traceback(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(dev_app, ["make-model", "--out", str(tmp_path / "x"), *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()

"""LoRA adapters as a user sees them: `infer dev make-lora` files, `ADAPTER` in a Modelfile (a layer of
Ollama's media type, listed by `infer show`), and an adapter model created, pushed, pulled and run: its
answer is the answer of a model with the adapter merged into its weights, on both engines."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file
from typer.testing import CliRunner

from cli.dev import app as dev_app
from cli.main import app
from registry.manifest import MEDIA_ADAPTER
from registry.modelbuilder import PRESETS, LoraSpec, build_gguf, build_lora
from registry.modelbuilder.lora_out import build_merged_gguf
from registry.names import parse_name
from registry.server import RegistryServerThread
from core.settings import RegistrySettings
from registry.store import Store

from .test_run import ROOT, cli_env

runner = CliRunner()
SPEC = PRESETS["tiny-qwen2"]
LORA = LoraSpec(rank=4, alpha=8.0, seed=3)


def invoke(*args: str):
    return runner.invoke(app, list(args))


def store() -> Store:
    return Store(RegistrySettings.from_env().models)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {"base": build_gguf(root / "base.gguf", SPEC, dtype="f32", seed=0),
            "merged": build_merged_gguf(root / "merged.gguf", SPEC, LORA),
            "lora": build_lora(root / "lora.gguf", SPEC, LORA),
            "peft": build_lora(root / "peft", SPEC, LORA, fmt="peft")}


def test_make_lora_writes_a_gguf_adapter_as_llama_cpp_does(tmp_path):
    out = tmp_path / "a.gguf"
    result = runner.invoke(dev_app, ["make-lora", "--preset", "tiny-llama", "-r", "4", "--alpha", "8",
                                     "--targets", "q_proj,v_proj", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{out}  ") and "KiB" in result.output
    reader = gguf.GGUFReader(out)
    fields = {k: reader.fields[k].contents() for k in ("general.type", "adapter.type", "adapter.lora.alpha",
                                                       "general.architecture")}
    assert fields == {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 8.0,
                      "general.architecture": "llama"}
    shapes = {t.name: t.shape.tolist() for t in reader.tensors}
    spec = PRESETS["tiny-llama"]
    assert len(shapes) == spec.num_layers * 4
    assert shapes["blk.0.attn_q.weight.lora_a"] == [spec.hidden_size, 4]  # GGUF dims: [in, r]
    assert shapes["blk.1.attn_v.weight.lora_b"] == [4, spec.num_kv_heads * spec.head_dim]  # [r, out]


def test_make_lora_writes_a_peft_directory(tmp_path):
    out = tmp_path / "peft"
    result = runner.invoke(dev_app, ["make-lora", "--format", "peft", "-r", "8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 8.0, "LORA")
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    tensors = load_file(out / "adapter_model.safetensors")
    stem = "base_model.model.model.layers.1.mlp.down_proj"
    assert tensors[f"{stem}.lora_A.weight"].shape == (8, SPEC.intermediate_size)
    assert tensors[f"{stem}.lora_B.weight"].shape == (SPEC.hidden_size, 8)
    assert len(tensors) == SPEC.num_layers * 7 * 2


def test_make_lora_refuses_bad_targets_in_one_line(tmp_path):
    result = runner.invoke(dev_app, ["make-lora", "--targets", "q_proj,lm_head", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and result.output.startswith("error: target modules must be some of")
    assert "Traceback" not in result.output and not (tmp_path / "x").exists()


def _create(tmp_path, name: str, text: str):
    (tmp_path / f"{name}.Modelfile").write_text(text)
    return invoke("create", name, "-f", str(tmp_path / f"{name}.Modelfile"))


def test_adapter_is_a_layer_that_show_lists(tmp_path, files):
    assert _create(tmp_path, "base", f"FROM {files['base']}\n").exit_code == 0
    created = _create(tmp_path, "tuned", f"FROM base\nADAPTER {files['lora']}\nPARAMETER temperature 0\n")
    assert created.exit_code == 0, created.output
    manifest = store().read_manifest(parse_name("tuned"))
    assert [lay.media_type.rsplit(".", 1)[-1] for lay in manifest.layers] == ["model", "adapter", "params"]
    layer = manifest.layer(MEDIA_ADAPTER)
    assert store().blob_path(layer.digest).read_bytes() == files["lora"].read_bytes()
    shown = invoke("show", "tuned").output
    assert "\n  Adapter\n    type                lora\n    alpha               8\n" in shown
    assert f"ADAPTER {store().blob_path(layer.digest)}\n" in invoke("show", "tuned", "--modelfile").output


def test_peft_adapter_is_converted_to_the_same_gguf_tensors(tmp_path, files):
    created = _create(tmp_path, "tuned", f"FROM {files['base']}\nADAPTER {files['peft']}\n")
    assert created.exit_code == 0, created.output
    assert "converting adapter" in created.output
    layer = store().read_manifest(parse_name("tuned")).layer(MEDIA_ADAPTER)
    ours, theirs = gguf.GGUFReader(store().blob_path(layer.digest)), gguf.GGUFReader(files["lora"])
    assert sorted(t.name for t in ours.tensors) == sorted(t.name for t in theirs.tensors)
    by_name = {t.name: t for t in theirs.tensors}
    for t in ours.tensors:
        np.testing.assert_array_equal(t.data, by_name[t.name].data)
    assert ours.fields["adapter.lora.alpha"].contents() == 8.0


@pytest.mark.parametrize("line, problem", [
    ("ADAPTER {base}", "a GGUF model, not a LoRA adapter (general.type 'model'"),
    ("ADAPTER ./nothere.gguf", "ADAPTER ./nothere.gguf: no file or directory at"),
    ("ADAPTER {lora}\nADAPTER {lora}", "one ADAPTER per model"),
    ("ADAPTER {empty}", "a PEFT adapter directory needs adapter_config.json and adapter_model.safetensors"),
])
def test_create_refuses_what_is_not_an_adapter(tmp_path, files, line, problem):
    (tmp_path / "empty").mkdir()
    text = f"FROM {files['base']}\n" + line.format(base=files["base"], lora=files["lora"], empty=tmp_path / "empty")
    result = _create(tmp_path, "bad", text + "\n")
    last = result.output.splitlines()[-1]
    assert result.exit_code == 1 and last.startswith("Error: ") and problem in last, result.output
    assert not store().manifests_dir.exists() or not list(store().manifests_dir.rglob("bad"))


def _run(model: str, engine: str, home) -> str:
    result = subprocess.run([sys.executable, "-m", "cli", "run", model, "Say something.", "--engine", engine],
                            check=False, capture_output=True, text=True, env=cli_env(INFER_HOME=str(home)),
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow  # three `infer run` processes: about 15 s each engine
@pytest.mark.parametrize("engine", ["native", "llamacpp"])
def test_adapter_model_through_create_push_pull_run(tmp_path, files, monkeypatch, engine):
    greedy = "PARAMETER temperature 0\nPARAMETER num_predict 12\nPARAMETER num_ctx 256\n"
    assert _create(tmp_path, "merged", f"FROM {files['merged']}\n{greedy}").exit_code == 0
    assert _create(tmp_path, "base", f"FROM {files['base']}\n{greedy}").exit_code == 0
    assert _create(tmp_path, "tuned", f"FROM base\nADAPTER {files['lora']}\n").exit_code == 0
    with RegistryServerThread(Store(tmp_path / "registry")) as server:
        remote = f"127.0.0.1:{server.port}/library/tuned:v1"
        assert invoke("cp", "tuned", remote).exit_code == 0
        pushed = invoke("push", remote, "--insecure")
        assert pushed.exit_code == 0, pushed.output
        monkeypatch.setenv("INFER_HOME", str(tmp_path / "other"))
        pulled = invoke("pull", remote, "--insecure")
        assert pulled.exit_code == 0, pulled.output
    consumer = Store(tmp_path / "other" / "models")
    assert consumer.read_manifest(parse_name(remote)).layer(MEDIA_ADAPTER) is not None
    home = tmp_path / "infer-home"
    answer = _run(remote, engine, tmp_path / "other")
    assert answer == _run("merged", engine, home)
    assert answer != _run("base", engine, home)

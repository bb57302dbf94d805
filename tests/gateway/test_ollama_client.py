"""The official ``ollama`` Python client against a live ``infer serve``.

The server runs over a module-private copy of the tiny models (this module copies, deletes,
creates and pulls); pulls and pushes go to a real registry server on a loopback port.
"""

from __future__ import annotations

import ollama
import pytest

from registry.create import create_model
from registry.modelbuilder import PRESETS, build_gguf
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from registry.server import RegistryServerThread
from registry.store import Store
from tests.gateway.conftest import private_store

FAST = {"num_predict": 8, "seed": 5}


@pytest.fixture(scope="module")
def tiny_store(tiny_store, tmp_path_factory):
    """A module-private copy of the session's tiny models."""
    return private_store(tiny_store, tmp_path_factory, "ollama-client")


@pytest.fixture(scope="module")
def client(live_server) -> ollama.Client:
    return ollama.Client(host=live_server.url, timeout=60)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A registry holding ``library/tiny:latest`` built from other weights than the local tiny model."""
    tmp = tmp_path_factory.mktemp("registry")
    store = Store(tmp / "store")
    gguf = build_gguf(tmp / "other.gguf", PRESETS["tiny-qwen2"], dtype="f32", seed=11)
    create_model(store, parse_name("tiny"), parse_modelfile(f"FROM {gguf}\nPARAMETER num_ctx 256\n"), tmp)
    with RegistryServerThread(store) as server:
        yield server


def test_chat_streaming_and_not(client):
    messages = [{"role": "user", "content": "Hello!"}]
    parts = list(client.chat(model="tiny", messages=messages, stream=True, options=FAST))
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert all(p.message.content for p in parts[:-1]) and not any(p.done for p in parts[:-1])
    whole = client.chat(model="tiny", messages=messages, options=FAST)
    assert whole.message.role == "assistant"
    assert whole.message.content == "".join(p.message.content for p in parts)
    assert whole.eval_count == parts[-1].eval_count and whole.prompt_eval_count > 0
    assert whole.total_duration > 0 and whole.eval_duration >= 0


def test_generate(client):
    out = client.generate(model="tiny-go", prompt="Why?", options=FAST)
    assert out.done and out.model == "tiny-go" and out.context and out.eval_count <= 8
    streamed = list(client.generate(model="tiny-go", prompt="Why?", options=FAST, stream=True))
    assert "".join(p.response for p in streamed) == out.response


def test_list_show_and_ps(client):
    listed = {m.model: m for m in client.list().models}
    assert {"tiny:latest", "tiny-go:latest"} <= set(listed)
    tiny = listed["tiny:latest"]
    assert tiny.size > 0 and tiny.modified_at is not None and tiny.details.family == "qwen2"
    shown = client.show("tiny-go")
    assert 'SYSTEM """You are a tiny test model."""' in shown.modelfile and "stop" in shown.parameters
    assert shown.modelinfo["general.architecture"] == "qwen2" and shown.capabilities == ["completion"]
    assert shown.details.format == "gguf" and shown.modified_at is not None
    client.generate(model="tiny", prompt="")  # load
    [loaded] = [m for m in client.ps().models if m.model == "tiny:latest"]
    assert loaded.expires_at is not None and loaded.size_vram == 0 and loaded.context_length == 512
    client.chat(model="tiny", messages=[], keep_alive=-1)  # loaded for good
    [loaded] = [m for m in client.ps().models if m.model == "tiny:latest"]
    assert loaded.expires_at.year > 2200
    with pytest.raises(ollama.ResponseError) as err:
        client.show("missing-model")
    assert err.value.status_code == 404 and "not found" in err.value.error


def test_embed(client):
    out = client.embed(model="tiny", input=["a sentence", "another one"])
    assert len(out.embeddings) == 2 and out.prompt_eval_count > 0
    legacy = client.embeddings(model="tiny", prompt="a sentence")
    assert len(legacy.embedding) == len(out.embeddings[0])


def test_copy_then_delete(client):
    assert client.copy("tiny", "tiny-copy").status == "success"
    assert "tiny-copy:latest" in [m.model for m in client.list().models]
    assert client.chat(model="tiny-copy", messages=[{"role": "user", "content": "x"}], options=FAST).done
    assert client.delete("tiny-copy").status == "success"
    assert "tiny-copy:latest" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as err:
        client.delete("tiny-copy")
    assert err.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as err:
        client.copy("no-such-model", "x")
    assert err.value.status_code == 404


def test_create_from_an_uploaded_blob(client, tmp_path):
    gguf = build_gguf(tmp_path / "new.gguf", PRESETS["tiny-qwen2"], dtype="f32", seed=21)
    digest = client.create_blob(gguf)
    assert client._client.head(f"/api/blobs/{digest}").status_code == 200
    statuses = [p.status for p in client.create(
        model="made", files={"new.gguf": digest}, system="Be brief.", stream=True,
        parameters={"num_ctx": 256, "stop": ["<|im_end|>"], "temperature": 0.5},
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])]
    assert statuses[0] == "gathering model components" and "parsing GGUF" in statuses
    assert statuses[-2:] == ["writing manifest", "success"]
    shown = client.show("made")
    assert 'SYSTEM """Be brief."""' in shown.modelfile and "temperature" in shown.parameters
    assert client.generate(model="made", prompt="hi", options=FAST).done
    assert client.create(model="made-2", from_="made", system="Other.").status == "success"
    assert 'SYSTEM """Other."""' in client.show("made-2").modelfile
    with pytest.raises(ollama.ResponseError) as err:
        client.create(model="bad", files={"x.gguf": "sha256:" + "0" * 64})
    assert err.value.status_code == 400 and "upload it first" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.create(model="bad", from_="made", quantize="q4_K_M")
    assert err.value.status_code == 400 and "quantize" in err.value.error


def test_blob_upload_checks_the_digest(client):
    resp = client._client.post("/api/blobs/sha256:" + "1" * 64, content=b"not that")
    assert resp.status_code == 400 and "digest mismatch" in resp.json()["error"]
    assert client._client.head("/api/blobs/sha256:" + "1" * 64).status_code == 404
    assert client._client.head("/api/blobs/not-a-digest").status_code == 400


def test_pull_from_a_registry_then_push_back(client, registry):
    name = f"127.0.0.1:{registry.port}/library/tiny:latest"
    events = list(client.pull(name, insecure=True, stream=True))
    statuses = [e.status for e in events]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest",
                                                                    "success"]
    layers = [e for e in events if e.digest]
    assert layers and all(e.status == f"pulling {e.digest[7:19]}" and e.total for e in layers)
    assert any(e.completed == e.total for e in layers)
    assert name in [m.model for m in client.list().models]
    assert client.show(name).details.family == "qwen2"
    assert client.generate(model=name, prompt="hi", options=FAST).done
    assert client.pull(name, insecure=True).status == "success"  # again: nothing to download

    assert client.copy("tiny-go", f"127.0.0.1:{registry.port}/library/mine:v1").status == "success"
    statuses = [p.status for p in client.push(f"127.0.0.1:{registry.port}/library/mine:v1", insecure=True,
                                              stream=True)]
    assert statuses[0] == "retrieving manifest" and statuses[-1] == "success"
    assert any(n.model == "mine" and n.tag == "v1" for n in registry.store.iter_names())


def test_pull_errors(client, registry):
    with pytest.raises(ollama.ResponseError) as err:
        client.pull(f"127.0.0.1:{registry.port}/library/absent:latest", insecure=True, stream=False)
    assert err.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as err:  # mid-stream: the last line is the error
        list(client.pull(f"127.0.0.1:{registry.port}/library/absent:latest", insecure=True, stream=True))
    assert "absent" in err.value.error or "not found" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.pull(f"127.0.0.1:{registry.port}/library/tiny:latest")  # no insecure: https, which fails
    assert err.value.status_code == 502 and "could not reach" in err.value.error
    assert client.generate(model="tiny", prompt="still serving", options=FAST).done

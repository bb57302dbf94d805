import hashlib
import json
import os

import pytest

from registry.errors import ModelNotFound, RegistryError
from registry.manifest import CONFIG_MEDIA_TYPE, MEDIA_MODEL, Layer, Manifest
from registry.names import parse_name
from registry.store import Store


def add_model(store: Store, name: str, payload: bytes) -> bytes:
    model = store.add_blob_bytes(payload)
    config = store.add_blob_bytes(b'{"model_format":"gguf"}\n')
    manifest = Manifest(config=Layer(mediaType=CONFIG_MEDIA_TYPE, digest=config, size=23),
                        layers=[Layer(mediaType=MEDIA_MODEL, digest=model, size=len(payload))])
    raw = manifest.to_bytes()
    store.write_manifest(parse_name(name), raw)
    return raw


def test_ollama_layout_on_disk(tmp_path):
    store = Store(tmp_path)
    raw = add_model(store, "qwen2:0.5b", b"weights")
    digest = hashlib.sha256(b"weights").hexdigest()
    assert (tmp_path / "blobs" / f"sha256-{digest}").read_bytes() == b"weights"
    assert (tmp_path / "manifests/registry.ollama.ai/library/qwen2/0.5b").read_bytes() == raw
    assert json.loads(raw)["layers"][0]["digest"] == f"sha256:{digest}"


def test_list_reports_name_id_size_newest_first(tmp_path):
    store = Store(tmp_path)
    raw_a = add_model(store, "a:1", b"x" * 100)
    add_model(store, "team/b:2", b"y" * 50)
    os.utime(store.manifest_path(parse_name("a:1")), (1, 1))
    models = store.list_models()
    assert [m.name.display for m in models] == ["team/b:2", "a:1"]
    assert models[1].id == hashlib.sha256(raw_a).hexdigest()[:12]
    assert models[1].size == 100 + 23


def test_manifest_never_points_at_missing_blob(tmp_path):
    store = Store(tmp_path)
    manifest = Manifest(config=Layer(mediaType=CONFIG_MEDIA_TYPE, digest="sha256:" + "0" * 64, size=1),
                        layers=[])
    with pytest.raises(RegistryError, match="missing blob"):
        store.write_manifest(parse_name("ghost"), manifest.to_bytes())
    assert not store.manifest_path(parse_name("ghost")).exists()


def test_rm_prunes_only_unreferenced_blobs_and_keeps_partials(tmp_path):
    store = Store(tmp_path)
    add_model(store, "a", b"shared-weights")
    add_model(store, "b", b"other-weights")
    store.copy(parse_name("a"), parse_name("a-copy"))
    partial = store.blobs_dir / ("sha256-" + "1" * 64 + "-partial")
    partial.write_bytes(b"half")
    store.remove(parse_name("a"))
    assert store.has_blob(store.read_manifest(parse_name("a-copy")).layers[0].digest)
    removed = store.remove(parse_name("b"))
    assert removed == ["sha256:" + hashlib.sha256(b"other-weights").hexdigest()]
    assert partial.exists()
    with pytest.raises(ModelNotFound):
        store.remove(parse_name("b"))


def test_resolve_is_case_insensitive(tmp_path):
    store = Store(tmp_path)
    add_model(store, "Qwen2:0.5B", b"w")
    assert store.resolve("qwen2:0.5b").display == "Qwen2:0.5B"


def test_stray_files_are_never_listed(tmp_path):
    store = Store(tmp_path)
    add_model(store, "good", b"w")
    junk = store.manifests_dir / "registry.ollama.ai" / "library" / "bad name" / "latest"
    junk.parent.mkdir(parents=True)
    junk.write_text("{}")
    assert [m.name.display for m in store.list_models()] == ["good:latest"]


def test_add_blob_file_is_atomic_and_deduplicated(tmp_path):
    store = Store(tmp_path / "store")
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(3 << 20))
    digest, size = store.add_blob_file(src)
    assert (digest, size) == ("sha256:" + hashlib.sha256(src.read_bytes()).hexdigest(), 3 << 20)
    assert store.add_blob_file(src) == (digest, size)
    assert sorted(p.name for p in store.blobs_dir.iterdir()) == [digest.replace(":", "-")]

"""GGUF headers that lie are refused before a model is made of them (issue 40, finding 4): an unknown
version, and a metadata array longer than the bytes left in the file, each a 400 from ``/api/create``
naming the field."""

from __future__ import annotations

import hashlib
import struct

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from core.settings import ServerSettings
from gguf_io.gguf_file import GGUFFile, read_header
from fakes.live import server_env
from tests.gateway.conftest import private_store

UINT8, STRING, ARRAY = 0, 8, 9


def gguf(*fields: bytes, version: int = 3) -> bytes:
    """A header with no tensors and ``fields`` (each a key-value already encoded)."""
    return b"GGUF" + struct.pack("<IQQ", version, 0, len(fields)) + b"".join(fields)


def string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv_string(key: str, value: str) -> bytes:
    return string(key) + struct.pack("<I", STRING) + string(value)


def kv_array(key: str, kind: int, count: int, payload: bytes = b"") -> bytes:
    return string(key) + struct.pack("<IIQ", ARRAY, kind, count) + payload


ARCH = kv_string("general.architecture", "qwen2")


@pytest.mark.parametrize("data, message", [
    (gguf(ARCH, version=99), "field 'version': GGUF version 99"),
    (gguf(ARCH, version=1), "field 'version': GGUF version 1"),
    (gguf(ARCH, kv_array("tokenizer.ggml.scores", UINT8, 1 << 61)), "'tokenizer.ggml.scores'"),
    (gguf(kv_array("tokenizer.ggml.tokens", STRING, 1 << 40, string("a"))), "'tokenizer.ggml.tokens'"),
])
@pytest.mark.parametrize("reader", [read_header, GGUFFile])
def test_both_readers_refuse_what_cannot_be_in_the_file(tmp_path, data, message, reader):
    """The registry's header read and the engine's loader are one reader (gguf_io/gguf_file.py)."""
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        reader(path)


def test_a_small_array_that_fits_is_read(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf(ARCH, kv_array("x.ids", UINT8, 3, bytes([1, 2, 3]))))
    assert read_header(path).metadata == {"general.architecture": "qwen2", "x.ids": [1, 2, 3]}


@pytest.fixture
def client(tiny_store, tmp_path_factory, tmp_path):
    store = private_store(tiny_store, tmp_path_factory, "gguf-lies")
    settings = ServerSettings.from_env(server_env(tmp_path / "home", store.root, 11434))
    with TestClient(create_app(settings), base_url="http://127.0.0.1:11434") as client:
        yield client


def test_api_create_answers_400_naming_the_field(client, tiny_store):
    whole = (tiny_store.root.parent / "tiny-qwen2.gguf").read_bytes()
    version_99 = whole[:4] + struct.pack("<I", 99) + whole[8:]
    huge_array = gguf(ARCH, kv_array("tokenizer.ggml.scores", UINT8, 1 << 61))
    for data, field in ((version_99, "version"), (huge_array, "tokenizer.ggml.scores")):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        assert client.post(f"/api/blobs/{digest}", content=data).status_code == 201
        r = client.post("/api/create", json={"model": "liar", "files": {"m.gguf": digest}, "stream": False})
        assert r.status_code == 400 and f"'{field}'" in r.json()["error"], r.text
    assert "liar" not in [m["name"].split(":")[0] for m in client.get("/api/tags").json()["models"]]

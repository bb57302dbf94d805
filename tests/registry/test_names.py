import pytest

from registry.errors import InvalidName
from registry.names import parse_digest, parse_name, short_digest


def test_short_name_resolves_to_public_registry_url():
    name = parse_name("qwen2:0.5b")
    assert name.manifest_url == "https://registry.ollama.ai/v2/library/qwen2/manifests/0.5b"
    assert name.display == "qwen2:0.5b"
    assert name.path_parts == ("registry.ollama.ai", "library", "qwen2", "0.5b")


@pytest.mark.parametrize("text, full, display", [
    ("llama3", "registry.ollama.ai/library/llama3:latest", "llama3:latest"),
    ("team/coder:7b", "registry.ollama.ai/team/coder:7b", "team/coder:7b"),
    ("127.0.0.1:5000/library/tiny:v1", "127.0.0.1:5000/library/tiny:v1", "127.0.0.1:5000/library/tiny:v1"),
    ("localhost:8787/library/tiny", "localhost:8787/library/tiny:latest", "localhost:8787/library/tiny:latest"),
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
     "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"),
    ("huggingface.co/org/repo", "hf.co/org/repo:latest", "hf.co/org/repo:latest"),
])
def test_grammar_and_defaults(text, full, display):
    name = parse_name(text)
    assert name.full == full
    assert name.display == display


def test_hf_names_use_the_same_protocol():
    name = parse_name("hf.co/org/repo:Q8_0")
    assert name.manifest_url == "https://hf.co/v2/org/repo/manifests/Q8_0"


def test_insecure_defaults_to_http_and_http_needs_insecure():
    assert parse_name("127.0.0.1:5000/library/tiny", insecure=True).manifest_url == \
        "http://127.0.0.1:5000/v2/library/tiny/manifests/latest"
    with pytest.raises(InvalidName, match="--insecure"):
        parse_name("http://127.0.0.1:5000/library/tiny")
    assert parse_name("http://127.0.0.1:5000/library/tiny", insecure=True).scheme == "http"


@pytest.mark.parametrize("bad", [
    "", " ", "a/b/c/d", "../etc/passwd", "library/..", "..", "a/../b", "model:", ":tag", "/model",
    "model/", "ns//model", "mo del", "model:ta g", "model@sha256:abc", "ftp://host/ns/m",
    "host/na.me/model", "-model", "model:" + "x" * 81, "%2e%2e/model",
])
def test_malformed_names_are_rejected_before_any_io(bad):
    with pytest.raises(InvalidName) as err:
        parse_name(bad)
    assert "\n" not in str(err.value)


def test_digests():
    hexd = "ab" * 32
    assert parse_digest(f"sha256:{hexd}") == f"sha256:{hexd}"
    assert parse_digest(f"sha256-{hexd}") == f"sha256:{hexd}"
    assert short_digest(f"sha256:{hexd}") == hexd[:12]
    for bad in ["sha256:" + "AB" * 32, "sha256:abc", "sha256:../../etc/passwd", "md5:" + hexd,
                f"sha256:{hexd}-partial", f"sha256:{hexd}/x"]:
        with pytest.raises(InvalidName):
            parse_digest(bad)

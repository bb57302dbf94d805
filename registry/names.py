"""Model names and digests, Ollama's grammar: ``[scheme://][host/][namespace/]model[:tag]``.

Parsing never touches the network or the disk, and everything that ends up in a URL or a
file path goes through here first, so a name can never escape the store (no ``..``, no
slashes inside a part, no absolute paths).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidName

DEFAULT_SCHEME = "https"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
HF_HOSTS = ("hf.co", "huggingface.co")

_HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}")
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}")
_NAMESPACE_HF_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}")
_PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}")
_DIGEST_RE = re.compile(r"sha256[:-]([0-9a-f]{64})")


@dataclass(frozen=True)
class ModelName:
    scheme: str
    host: str
    namespace: str
    model: str
    tag: str

    @property
    def display(self) -> str:
        """Shortest form, as ``ollama list`` prints it: defaults dropped."""
        out = f"{self.model}:{self.tag}"
        if self.host != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{out}"
        if self.namespace != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{out}"
        return out

    @property
    def full(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}"

    @property
    def repository(self) -> str:
        return f"{self.namespace}/{self.model}"

    @property
    def manifest_url(self) -> str:
        return f"{self.base_url}/v2/{self.repository}/manifests/{self.tag}"

    def blob_url(self, digest: str) -> str:
        return f"{self.base_url}/v2/{self.repository}/blobs/{digest}"

    @property
    def path_parts(self) -> tuple[str, str, str, str]:
        """Relative path of the manifest under ``manifests/``: host, namespace, model, tag."""
        return (self.host, self.namespace, self.model, self.tag)

    def with_host(self, host: str, scheme: str | None = None) -> "ModelName":
        return ModelName(scheme or self.scheme, host, self.namespace, self.model, self.tag)


def parse_name(text: str, *, insecure: bool = False) -> ModelName:
    """Parse a model name, filling Ollama's defaults; raise InvalidName on anything odd.

    ``insecure`` allows ``http://`` and, as in Ollama, makes plain http the default scheme.
    """
    raw = text.strip()
    if not raw:
        raise InvalidName("model name is empty; expected e.g. 'qwen2:0.5b'")
    scheme, rest = _split_scheme(raw, "http" if insecure else DEFAULT_SCHEME)
    if "@" in rest:
        raise InvalidName(f"invalid model name {text!r}: pulling by @digest is not supported, use a tag")
    rest, tag = _split_tag(rest, text)
    parts = rest.split("/")
    if len(parts) > 3 or any(p == "" for p in parts):
        raise InvalidName(f"invalid model name {text!r}: expected [host/][namespace/]model[:tag]")
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(parts) == 3:
        host, namespace, model = parts
    elif len(parts) == 2:
        namespace, model = parts
    else:
        (model,) = parts
    if host.lower() in HF_HOSTS:
        host = "hf.co"
    _check(_HOST_RE, host, "host", text)
    ns_re = _NAMESPACE_HF_RE if host == "hf.co" else _NAMESPACE_RE
    _check(ns_re, namespace, "namespace", text)
    _check(_PART_RE, model, "model", text)
    _check(_PART_RE, tag, "tag", text)
    if scheme == "http" and not insecure:
        raise InvalidName(f"refusing plain http for {text!r}; pass --insecure to allow it")
    return ModelName(scheme, host, namespace, model, tag)


def _split_scheme(raw: str, default: str) -> tuple[str, str]:
    if "://" not in raw:
        return default, raw
    scheme, rest = raw.split("://", 1)
    if scheme not in ("http", "https"):
        raise InvalidName(f"invalid model name {raw!r}: scheme must be http or https")
    if "/" not in rest:
        raise InvalidName(f"invalid model name {raw!r}: a scheme needs a host, e.g. http://host/model")
    return scheme, rest


def _split_tag(rest: str, original: str) -> tuple[str, str]:
    colon, slash = rest.rfind(":"), rest.rfind("/")
    if colon > slash:
        tag = rest[colon + 1 :]
        if not tag:
            raise InvalidName(f"invalid model name {original!r}: empty tag after ':'")
        return rest[:colon], tag
    return rest, DEFAULT_TAG


def _check(pattern: re.Pattern[str], value: str, what: str, original: str) -> None:
    if not pattern.fullmatch(value) or ".." in value:
        raise InvalidName(f"invalid model name {original!r}: bad {what} {value!r}")


def parse_digest(text: str) -> str:
    """Normalise ``sha256:<hex>`` or ``sha256-<hex>`` to ``sha256:<hex>``; reject anything else."""
    match = _DIGEST_RE.fullmatch(text.strip())
    if not match:
        raise InvalidName(f"invalid digest {text!r}: expected sha256:<64 lowercase hex digits>")
    return f"sha256:{match.group(1)}"


def short_digest(digest: str) -> str:
    """First 12 hex digits, as Ollama's progress labels and IDs show them."""
    return parse_digest(digest)[7:19]

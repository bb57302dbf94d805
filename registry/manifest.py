"""Manifests and layers, byte-compatible with Ollama's (Docker distribution v2 schema).

A manifest is kept as the raw bytes the registry sent: the model ID is their sha256.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import RegistryError
from .names import parse_digest

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
_OLLAMA = "application/vnd.ollama.image."
MEDIA_MODEL = _OLLAMA + "model"
MEDIA_TEMPLATE = _OLLAMA + "template"
MEDIA_PROMPT = _OLLAMA + "prompt"
MEDIA_SYSTEM = _OLLAMA + "system"
MEDIA_PARAMS = _OLLAMA + "params"
MEDIA_MESSAGES = _OLLAMA + "messages"
MEDIA_LICENSE = _OLLAMA + "license"
MEDIA_ADAPTER = _OLLAMA + "adapter"
MEDIA_PROJECTOR = _OLLAMA + "projector"


class Layer(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")

    media_type: str = Field(alias="mediaType")
    digest: str
    size: int = Field(ge=0)
    from_: str | None = Field(default=None, alias="from")

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        return parse_digest(value)

    def wire(self) -> dict:
        out: dict = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.from_:
            out["from"] = self.from_
        return out


class Manifest(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")

    schema_version: int = Field(default=2, alias="schemaVersion")
    media_type: str = Field(default=MANIFEST_MEDIA_TYPE, alias="mediaType")
    config: Layer
    layers: list[Layer]

    @classmethod
    def parse(cls, raw: bytes) -> "Manifest":
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise RegistryError(f"malformed manifest: {where}: {first['msg']}") from None

    def to_bytes(self) -> bytes:
        """Compact JSON with the field order Ollama writes."""
        body = {
            "schemaVersion": self.schema_version,
            "mediaType": self.media_type,
            "config": self.config.wire(),
            "layers": [layer.wire() for layer in self.layers],
        }
        return json.dumps(body, separators=(",", ":")).encode()

    def all_layers(self) -> list[Layer]:
        """Layers in download order: every layer, then the config (as Ollama pulls them)."""
        return [*self.layers, self.config]

    def layer(self, media_type: str) -> Layer | None:
        return next((lay for lay in self.layers if lay.media_type == media_type), None)

    @property
    def total_size(self) -> int:
        return sum(layer.size for layer in self.all_layers())


def digest_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()

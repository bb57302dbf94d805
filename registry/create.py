"""``infer create NAME -f Modelfile``: build a model's layers and manifest in the store.

FROM a local GGUF file (copied into the store, verified as GGUF) or an existing model
(its weights reused, its template/system/params/license/messages inherited unless the
Modelfile overrides them). ADAPTER adds a LoRA adapter layer (Ollama's
``application/vnd.ollama.image.adapter``): a GGUF LoRA as llama.cpp writes it, or a PEFT
directory (``adapter_config.json`` + ``adapter_model.safetensors``), converted to a GGUF LoRA
first as Ollama does. Layers use Ollama's media types, so the result pushes and pulls like any
registry model.
"""

from __future__ import annotations

import json
import platform
import tempfile
from pathlib import Path

from .details import load_details
from .errors import ModelfileError, ModelNotFound, RegistryError
from .gguf_info import GGUFInfo, is_gguf, read_gguf_info
from .manifest import (CONFIG_MEDIA_TYPE, MEDIA_ADAPTER, MEDIA_LICENSE, MEDIA_MESSAGES, MEDIA_MODEL,
                       MEDIA_PARAMS, MEDIA_PROJECTOR, MEDIA_SYSTEM, MEDIA_TEMPLATE, Layer, Manifest,
                       digest_bytes)
from .modelfile import Modelfile
from .names import ModelName
from .progress import ProgressCallback, ProgressEvent, ignore
from .store import Store
from .templates import GoTemplate, TemplateError, to_go

_GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}
_INHERITED_WEIGHTS = (MEDIA_MODEL, MEDIA_ADAPTER, MEDIA_PROJECTOR)


class _Builder:
    def __init__(self, store: Store, emit: ProgressCallback) -> None:
        self.store, self.emit = store, emit
        self.layers: list[Layer] = []

    def add_bytes(self, media_type: str, data: bytes) -> None:
        digest = digest_bytes(data)
        self._announce(digest)
        self.store.add_blob_bytes(data)
        self.layers.append(Layer(mediaType=media_type, digest=digest, size=len(data)))

    def add_file(self, media_type: str, path: Path) -> Layer:
        digest, size = self.store.add_blob_file(path)
        self.emit(ProgressEvent(f"copying file {digest} 100%"))
        layer = Layer(mediaType=media_type, digest=digest, size=size)
        self.layers.append(layer)
        return layer

    def _announce(self, digest: str) -> None:
        verb = "using existing" if self.store.has_blob(digest) else "creating new"
        self.emit(ProgressEvent(f"{verb} layer {digest}"))


def create_model(store: Store, name: ModelName, mf: Modelfile, base_dir: Path,
                 on_progress: ProgressCallback = ignore) -> Manifest:
    on_progress(ProgressEvent("gathering model components"))
    b = _Builder(store, on_progress)
    inherited, info = _add_weights(store, b, mf.from_, base_dir)
    _add_adapters(b, mf.adapters, base_dir, info)
    _add_text_layers(b, mf, inherited)
    config = _config_blob(info, [lay.digest for lay in b.layers], inherited.get("parent_model", ""))
    b.add_bytes(CONFIG_MEDIA_TYPE, config)
    config_layer = b.layers.pop()
    manifest = Manifest(config=config_layer, layers=b.layers)
    on_progress(ProgressEvent("writing manifest"))
    store.write_manifest(name, manifest.to_bytes())
    on_progress(ProgressEvent("success"))
    return manifest


def _add_weights(store: Store, b: _Builder, source: str, base_dir: Path):
    path = _as_path(source, base_dir)
    if path is not None:
        return {}, _add_gguf(b, path)
    try:
        base = load_details(store, store.resolve(source))
    except ModelNotFound:
        raise ModelfileError(f"FROM {source}: no such file, and no local model of that name; "
                             f"pull it first ('infer pull {source}') or fix the path") from None
    b.layers.extend(lay for lay in base.manifest.layers if lay.media_type in _INHERITED_WEIGHTS)
    for lay in b.layers:
        b.emit(ProgressEvent(f"using existing layer {lay.digest}"))
    inherited = {"template": base.template, "system": base.system, "licenses": base.licenses,
                 "parameters": base.parameters, "messages": base.messages, "parent_model": base.name.display}
    return inherited, base.gguf


def _as_path(source: str, base_dir: Path) -> Path | None:
    candidate = (base_dir / Path(source).expanduser()).resolve()
    looks_like_path = source.startswith((".", "/", "~")) or source.lower().endswith(".gguf")
    if candidate.is_dir():
        raise ModelfileError(f"FROM {source}: directories (safetensors) are not supported yet; "
                             "convert to GGUF with llama.cpp's convert_hf_to_gguf.py")
    if candidate.is_file():
        return candidate
    if looks_like_path:
        raise ModelfileError(f"FROM {source}: file not found at {candidate}")
    return None


def _add_gguf(b: _Builder, path: Path) -> GGUFInfo:
    if not is_gguf(path):
        raise ModelfileError(f"FROM {path}: not a GGUF file; only GGUF weights can be imported")
    b.emit(ProgressEvent("parsing GGUF"))
    try:
        info = read_gguf_info(path, check_data=True)
    except RegistryError as exc:
        raise ModelfileError(str(exc)) from None
    b.add_file(MEDIA_MODEL, path)
    return info


def _add_adapters(b: _Builder, sources: list[str], base_dir: Path, base: GGUFInfo | None) -> None:
    inherited = sum(lay.media_type == MEDIA_ADAPTER for lay in b.layers)
    if len(sources) + inherited > 1:
        raise ModelfileError("one ADAPTER per model: the engines run a request through one LoRA adapter")
    for source in sources:
        path = (base_dir / Path(source).expanduser()).resolve()
        if path.is_dir():
            _add_peft(b, path, base)
        elif path.is_file():
            _add_gguf_lora(b, path, base)
        else:
            raise ModelfileError(f"ADAPTER {source}: no file or directory at {path}")


def _add_gguf_lora(b: _Builder, path: Path, base: GGUFInfo | None) -> None:
    if not is_gguf(path):
        raise ModelfileError(f"ADAPTER {path}: not a GGUF file; give a GGUF LoRA or a PEFT directory")
    try:
        meta = read_gguf_info(path, check_data=True).metadata
    except RegistryError as exc:
        raise ModelfileError(str(exc)) from None
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise ModelfileError(f"ADAPTER {path}: a GGUF model, not a LoRA adapter (general.type "
                             f"{meta.get('general.type')!r}; want 'adapter' with adapter.type 'lora')")
    arch = meta.get("general.architecture")
    if base is not None and arch != base.architecture:
        raise ModelfileError(f"ADAPTER {path}: made for a {arch} model, FROM is {base.architecture}")
    b.add_file(MEDIA_ADAPTER, path)


def _add_peft(b: _Builder, path: Path, base: GGUFInfo | None) -> None:
    from .modelbuilder.lora_out import PEFT_CONFIG, PEFT_WEIGHTS, peft_to_gguf, spec_from_metadata

    missing = [name for name in (PEFT_CONFIG, PEFT_WEIGHTS) if not (path / name).is_file()]
    if missing:
        raise ModelfileError(f"ADAPTER {path}: a PEFT adapter directory needs {' and '.join(missing)}")
    if base is None:
        raise ModelfileError(f"ADAPTER {path}: converting a PEFT adapter needs a GGUF base model")
    b.emit(ProgressEvent("converting adapter"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "adapter.gguf"
        try:
            peft_to_gguf(path, out, spec_from_metadata(base.metadata))
        except (KeyError, ValueError, OSError) as exc:
            raise ModelfileError(f"ADAPTER {path}: cannot convert the PEFT adapter: {exc}") from None
        b.add_file(MEDIA_ADAPTER, out)


def _add_text_layers(b: _Builder, mf: Modelfile, inherited: dict) -> None:
    template = mf.template if mf.template is not None else inherited.get("template")
    system = mf.system if mf.system is not None else inherited.get("system")
    licenses = mf.licenses or inherited.get("licenses") or []
    params = {**(inherited.get("parameters") or {}), **mf.parameters}
    messages = mf.messages or inherited.get("messages") or []
    if mf.template:
        check_template(mf.template)
    if template:
        b.add_bytes(MEDIA_TEMPLATE, template.encode())
    if system:
        b.add_bytes(MEDIA_SYSTEM, system.encode())
    for text in licenses:
        b.add_bytes(MEDIA_LICENSE, text.encode())
    if params:
        b.add_bytes(MEDIA_PARAMS, json.dumps(params, separators=(",", ":")).encode())
    if messages:
        b.add_bytes(MEDIA_MESSAGES, json.dumps(messages, separators=(",", ":")).encode())


def check_template(source: str) -> None:
    """Refuse a TEMPLATE that cannot render a simple conversation (unsupported actions such as
    ``{{define}}``, fields of missing values), so a bad template fails here and not on every request."""
    try:
        template = GoTemplate(source)
    except TemplateError as exc:
        raise ModelfileError(f"TEMPLATE: {exc}") from None
    turn = {"System": "", "Prompt": "hi", "Response": "", "Tools": None,
            "Messages": to_go([{"role": "user", "content": "hi"}])}
    try:
        template.render(turn)
    except Exception as exc:  # evaluation errors of every kind: the template is the user's input
        raise ModelfileError(f"TEMPLATE cannot render a conversation: {exc or type(exc).__name__}") from None


def _config_blob(info: GGUFInfo | None, diff_ids: list[str], parent: str = "") -> bytes:
    config = {
        "model_format": "gguf",
        "model_family": info.architecture if info else "",
        "model_families": [info.architecture] if info else [],
        "model_type": info.parameter_size if info else "",
        "file_type": info.file_type if info else "",
        "architecture": _GOARCH.get(platform.machine().lower(), platform.machine().lower()),
        "os": platform.system().lower(),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    if parent:  # FROM a local model (Ollama's details.parent_model; /v1/models' parent of an adapter model)
        config["parent_model"] = parent
    return json.dumps(config, separators=(",", ":")).encode() + b"\n"

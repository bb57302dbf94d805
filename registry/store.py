"""The local content-addressed store, in Ollama's exact layout::

    <root>/blobs/sha256-<hex>                       content, named by its digest
    <root>/blobs/sha256-<hex>-partial[-N]            an unfinished download (resumable)
    <root>/manifests/<host>/<namespace>/<model>/<tag>  raw manifest bytes; mtime = modified
    <root>/.infer-locks/                             advisory locks (outside Ollama's dirs)

Invariants: a blob file only ever appears complete and verified (rename of a fsynced temp
file), and a manifest is only written once every blob it references is present.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import DigestMismatch, ModelNotFound, RegistryError
from .fsutil import atomic_write, commit_file, disk_errors, file_lock
from .manifest import Manifest
from .names import ModelName, parse_digest, parse_name

CHUNK = 1 << 20


@dataclass(frozen=True)
class LocalModel:
    name: ModelName
    digest: str  # sha256:<hex> of the manifest bytes
    size: int
    modified: float

    @property
    def id(self) -> str:
        return self.digest[7:19]


class Store:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser()
        self.blobs_dir = self.root / "blobs"
        self.manifests_dir = self.root / "manifests"
        self.locks_dir = self.root / ".infer-locks"

    # -- blobs --------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.blobs_dir / parse_digest(digest).replace(":", "-")

    def partial_path(self, digest: str) -> Path:
        return self.blob_path(digest).with_name(self.blob_path(digest).name + "-partial")

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    @contextlib.contextmanager
    def blob_lock(self, digest: str, *, blocking: bool = True) -> Iterator[bool]:
        """Held while a blob is downloaded or imported: concurrent pulls share the work."""
        name = parse_digest(digest).replace(":", "-") + ".lock"
        with file_lock(self.locks_dir / name, blocking=blocking) as held:
            yield held

    def new_temp_blob(self) -> Path:
        self.blobs_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.blobs_dir, prefix=".import-", suffix=".tmp")
        os.close(fd)
        return Path(tmp)

    def commit_blob(self, tmp: Path, digest: str, *, actual: str | None = None) -> Path:
        """Move a fully written temp file into place after checking its digest."""
        digest = parse_digest(digest)
        got = actual or hash_file(tmp)
        if got != digest:
            tmp.unlink(missing_ok=True)
            raise DigestMismatch(digest, got)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        final = self.blob_path(digest)
        commit_file(tmp, final)
        return final

    def add_blob_bytes(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if not self.has_blob(digest):
            atomic_write(self.blob_path(digest), data)
        return digest

    def add_blob_file(self, src: Path) -> tuple[str, int]:
        """Copy a file into the store, hashing as it goes; returns (digest, size)."""
        tmp = self.new_temp_blob()
        sha, size = hashlib.sha256(), 0
        try:
            with disk_errors(tmp), open(src, "rb") as fin, open(tmp, "wb") as fout:
                while chunk := fin.read(CHUNK):
                    sha.update(chunk)
                    fout.write(chunk)
                    size += len(chunk)
            digest = "sha256:" + sha.hexdigest()
            with self.blob_lock(digest):
                if self.has_blob(digest):
                    tmp.unlink()
                else:
                    self.commit_blob(tmp, digest, actual=digest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return digest, size

    # -- manifests ----------------------------------------------------------------------
    def manifest_path(self, name: ModelName) -> Path:
        return self.manifests_dir.joinpath(*name.path_parts)

    def read_manifest_bytes(self, name: ModelName) -> bytes:
        path = self.manifest_path(name)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ModelNotFound(
                f"model '{name.display}' not found; run 'infer pull {name.display}' first"
            ) from None

    def read_manifest(self, name: ModelName) -> Manifest:
        return Manifest.parse(self.read_manifest_bytes(name))

    def write_manifest(self, name: ModelName, raw: bytes) -> None:
        manifest = Manifest.parse(raw)
        missing = [lay.digest for lay in manifest.all_layers() if not self.has_blob(lay.digest)]
        if missing:
            raise RegistryError(f"refusing to write manifest for {name.display}: missing blob {missing[0]}")
        atomic_write(self.manifest_path(name), raw)

    def iter_names(self) -> Iterator[ModelName]:
        if not self.manifests_dir.is_dir():
            return
        for path in sorted(self.manifests_dir.glob("*/*/*/*")):
            if not path.is_file() or path.name.startswith("."):
                continue
            host, namespace, model, tag = path.relative_to(self.manifests_dir).parts
            try:
                yield parse_name(f"{host}/{namespace}/{model}:{tag}")
            except RegistryError:
                continue  # a stray file that is not a valid name; never list it

    def list_models(self) -> list[LocalModel]:
        out = []
        for name in self.iter_names():
            path = self.manifest_path(name)
            raw = path.read_bytes()
            try:
                size = Manifest.parse(raw).total_size
            except RegistryError:
                continue
            digest = "sha256:" + hashlib.sha256(raw).hexdigest()
            out.append(LocalModel(name, digest, size, path.stat().st_mtime))
        return sorted(out, key=lambda m: m.modified, reverse=True)

    def resolve(self, text: str) -> ModelName:
        """Parse a user-typed name; match case-insensitively against local models (a name spelled as stored is
        found by one stat, without listing the store: every request resolves its model)."""
        name = parse_name(text, insecure=True)
        if self.manifest_path(name).is_file():
            return name
        for local in self.iter_names():
            if local.full.lower() == name.full.lower():
                return local
        return name

    def copy(self, src: ModelName, dst: ModelName) -> None:
        atomic_write(self.manifest_path(dst), self.read_manifest_bytes(src))

    def remove(self, name: ModelName) -> list[str]:
        """Delete a model's manifest, then every blob no other manifest references."""
        path = self.manifest_path(name)
        if not path.is_file():
            raise ModelNotFound(f"model '{name.display}' not found")
        path.unlink()
        for parent in list(path.parents)[:3]:
            with contextlib.suppress(OSError):
                parent.rmdir()
        return self.prune()

    # -- garbage collection ------------------------------------------------------------
    def referenced_digests(self) -> set[str]:
        refs: set[str] = set()
        for name in self.iter_names():
            try:
                refs.update(lay.digest for lay in self.read_manifest(name).all_layers())
            except RegistryError:
                continue
        return refs

    def prune(self) -> list[str]:
        """Remove complete blobs that no manifest references; keep partial downloads."""
        if not self.blobs_dir.is_dir():
            return []
        refs = self.referenced_digests()
        removed = []
        for path in sorted(self.blobs_dir.glob("sha256-*")):
            if path.name.count("-") != 1:
                continue  # -partial files: resumable state, not garbage
            digest = parse_digest(path.name)
            if digest in refs:
                continue
            with self.blob_lock(digest, blocking=False) as held:
                if held:
                    path.unlink(missing_ok=True)
                    removed.append(digest)
        return removed


def hash_file(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK * 4):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()

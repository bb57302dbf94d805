"""``infer pull``: manifest, then every blob, then the manifest written last.

Emits Ollama's statuses in Ollama's order: ``pulling manifest``, ``pulling <12hex>`` with
total/completed per layer, ``verifying sha256 digest``, ``writing manifest``, optionally
``removing unused layers``, ``success``.
"""

from __future__ import annotations

import time

from .client import RegistryClient
from .download import DownloadOptions, download_blob
from .errors import RegistryError
from .manifest import Manifest
from .names import ModelName, short_digest
from .progress import ProgressCallback, ProgressEvent, ignore
from .store import Store

PROGRESS_INTERVAL = 0.06  # seconds between progress events for one layer, as Ollama


class _LayerProgress:
    """Turns per-chunk byte counts into throttled progress events."""

    def __init__(self, digest: str, total: int, emit: ProgressCallback) -> None:
        self.event = ProgressEvent(f"pulling {short_digest(digest)}", digest, total)
        self.completed, self.emit, self._last = 0, emit, 0.0

    def __call__(self, nbytes: int) -> None:
        self.completed += nbytes
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL:
            self._last = now
            self._send()

    def _send(self) -> None:
        ev = self.event
        self.emit(ProgressEvent(ev.status, ev.digest, ev.total, min(self.completed, ev.total or 0)))

    def finish(self) -> None:
        self.completed = self.event.total or 0
        self._send()


async def pull_model(store: Store, name: ModelName, client: RegistryClient,
                     on_progress: ProgressCallback = ignore,
                     opts: DownloadOptions | None = None) -> Manifest:
    on_progress(ProgressEvent("pulling manifest"))
    raw = await client.get_manifest(name)
    manifest = Manifest.parse(raw)
    previous = _previous_layers(store, name)
    for layer in manifest.all_layers():
        progress = _LayerProgress(layer.digest, layer.size, on_progress)
        if not store.has_blob(layer.digest):
            url = await client.blob_location(name, layer.digest)
            await download_blob(client, store, url, layer.digest, layer.size, progress, opts)
        progress.finish()
    on_progress(ProgressEvent("verifying sha256 digest"))
    on_progress(ProgressEvent("writing manifest"))
    store.write_manifest(name, raw)
    if previous - {lay.digest for lay in manifest.all_layers()}:
        on_progress(ProgressEvent("removing unused layers"))
        store.prune()
    on_progress(ProgressEvent("success"))
    return manifest


def _previous_layers(store: Store, name: ModelName) -> set[str]:
    try:
        return {lay.digest for lay in store.read_manifest(name).all_layers()}
    except RegistryError:
        return set()

"""Pull throughput over loopback: `infer`'s pull client vs curl, same server, same run.

Starts `infer registry serve` on a free loopback port over a store holding one random blob
(1 GiB by default), then alternates: curl downloads the blob URL to a file, our client pulls
the model into a fresh store (ranged parallel parts, sha256 verified, atomic rename).
Prints each run and the ratio of medians (goal: >= 0.9x curl).

    .venv/bin/python bench/pull.py [--size-mib 1024] [--runs 3] [--streams 16] [--part-mib N]

``--streams``/``--part-mib`` override the client's part plan (default: Ollama's,
clamp(size/16, 100 MB, 1 GB) parts, 16 at once) to compare scheduling choices.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fakes.live import free_port  # noqa: E402
from registry.client import RegistryClient  # noqa: E402
from registry.download import DownloadOptions  # noqa: E402
from registry.manifest import CONFIG_MEDIA_TYPE, MEDIA_MODEL, Layer, Manifest  # noqa: E402
from registry.names import parse_name  # noqa: E402
from registry.pull import pull_model  # noqa: E402
from registry.store import Store  # noqa: E402

WORK = ROOT / ".bench" / "pull"


def make_store(size: int) -> tuple[Store, str]:
    store = Store(WORK / "server")
    marker = WORK / f"blob-{size}.digest"
    if marker.exists() and store.has_blob(marker.read_text()):
        return store, marker.read_text()
    shutil.rmtree(WORK, ignore_errors=True)
    tmp, sha = store.new_temp_blob(), hashlib.sha256()
    with open(tmp, "wb") as fh:
        for _ in range(size // (16 << 20)):
            chunk = os.urandom(16 << 20)
            sha.update(chunk)
            fh.write(chunk)
    digest = "sha256:" + sha.hexdigest()
    store.commit_blob(tmp, digest, actual=digest)
    config = store.add_blob_bytes(b'{"model_format":"gguf"}\n')
    manifest = Manifest(config=Layer(mediaType=CONFIG_MEDIA_TYPE, digest=config, size=24),
                        layers=[Layer(mediaType=MEDIA_MODEL, digest=digest, size=size)])
    store.write_manifest(parse_name("bench:latest"), manifest.to_bytes())
    marker.write_text(digest)
    return store, digest



def start_server(store: Store, port: int) -> subprocess.Popen:
    infer = Path(sys.executable).with_name("infer")
    proc = subprocess.Popen([str(infer), "registry", "serve", "--root", str(store.root), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("registry server did not start")


def run_curl(url: str, out: Path | None) -> float:
    """curl with its defaults, writing the file (like a pull does), or to /dev/null if ``out`` is None."""
    start = time.perf_counter()
    subprocess.run(["curl", "-sS", "--fail", "-o", str(out or "/dev/null"), url], check=True)
    elapsed = time.perf_counter() - start
    if out:
        out.unlink()
    return elapsed


def run_infer(port: int, opts: DownloadOptions) -> float:
    target = Store(WORK / "client")
    shutil.rmtree(target.root, ignore_errors=True)

    async def go() -> None:
        async with RegistryClient() as client:
            await pull_model(target, parse_name(f"127.0.0.1:{port}/library/bench", insecure=True), client,
                             opts=opts)

    start = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--streams", type=int, default=DownloadOptions.max_streams, help="parallel parts")
    parser.add_argument("--part-mib", type=int, default=None, help="part size (default: Ollama's plan)")
    args = parser.parse_args()
    opts = DownloadOptions(max_streams=args.streams, part_size=args.part_mib << 20 if args.part_mib else None)
    if shutil.which("curl") is None:
        raise SystemExit("curl is not installed; it is the reference this benchmark compares against")
    size = args.size_mib << 20
    store, digest = make_store(size)
    port = free_port()
    server = start_server(store, port)
    url = f"http://127.0.0.1:{port}/v2/library/bench/blobs/{digest}"
    try:
        run_curl(url, WORK / "warmup.bin")
        curl_s, null_s, infer_s = [], [], []
        plan = f"{args.part_mib} MiB parts" if args.part_mib else "Ollama's part plan"
        print(f"blob {size / 2**30:.2f} GiB over loopback from `infer registry serve`; {args.runs} runs each; "
              f"infer: {plan}, {args.streams} streams")
        print(f"{'run':>3}  {'curl -o file':>12}  {'infer pull':>10}  {'curl -o /dev/null':>17}   (GB/s)")
        for i in range(args.runs):
            curl_s.append(run_curl(url, WORK / "curl.bin"))
            infer_s.append(run_infer(port, opts))
            null_s.append(run_curl(url, None))
            print(f"{i + 1:>3}  {size / curl_s[-1] / 1e9:>12.2f}  {size / infer_s[-1] / 1e9:>10.2f}"
                  f"  {size / null_s[-1] / 1e9:>17.2f}")
    finally:
        server.terminate()
        server.wait(10)
    curl_rate, infer_rate = size / statistics.median(curl_s), size / statistics.median(infer_s)
    null_rate = size / statistics.median(null_s)
    print(f"median: curl -o file {curl_rate / 1e9:.2f} GB/s, infer pull {infer_rate / 1e9:.2f} GB/s "
          f"(incl. sha256 verify, fsync, atomic rename)")
    print(f"ratio infer/curl = {infer_rate / curl_rate:.2f}x (goal >= 0.90x); "
          f"vs curl discarding the data: {infer_rate / null_rate:.2f}x")


if __name__ == "__main__":
    main()

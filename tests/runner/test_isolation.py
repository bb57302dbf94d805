"""Runners import only the project, never the server's working directory (issue 40, finding 3).

``infer serve`` is started from a directory holding a hostile ``gguf.py``, ``torch.py`` and
``msgspec.py`` (each, if imported, leaves a ``.ran`` file beside itself and fails the import). Both
in-process engines' runners start, load the tiny model and answer; none of the three ever ran.
"""

from __future__ import annotations

import httpx
import pytest

from fakes.live import start_server, stop_server

HOSTILE = ("gguf", "torch", "msgspec")
PAYLOAD = """from pathlib import Path
Path(__file__).with_suffix(".ran").write_text("imported from the working directory")
raise ImportError("hostile module imported from the server's working directory")
"""


@pytest.fixture(scope="module")
def server(tiny_store, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("hostile-cwd")
    for name in HOSTILE:
        (cwd / f"{name}.py").write_text(PAYLOAD)
    live = start_server(tmp_path_factory.mktemp("isolation"), tiny_store.root, cwd=cwd)
    try:
        yield live, cwd
    finally:
        stop_server(live)


@pytest.mark.parametrize("engine", ["llamacpp", "native"])
def test_runners_do_not_import_modules_from_the_servers_working_directory(server, engine):
    live, cwd = server
    body = {"model": "tiny", "prompt": "hello", "stream": False, "options": {"engine": engine, "num_predict": 3}}
    r = httpx.post(live.url + "/api/generate", json=body, timeout=120)
    assert r.status_code == 200, (r.text, live.log()[-2000:])
    assert r.json()["eval_count"] >= 1
    assert sorted(p.name for p in cwd.glob("*.ran")) == [], live.log()[-2000:]

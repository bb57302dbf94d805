"""A client's template cannot take the host down: the red team's ``{{ range 20000000 }}{{ end }}``
(+2 GB of RSS and 11 s before) is a 400 in under 100 ms, and the server's peak RSS grows by less
than 50 MB, measured on a live ``infer serve`` (``/proc/PID/status``: VmHWM, the high-water mark).
Other bombs (nested loops, output, a value that doubles) stop at their limits, well within a second."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from fakes.live import start_server, stop_server

BOMBS = {
    "range": "{{ range 20000000 }}{{ end }}",
    "nested": "{{ range 5000 }}{{ range 5000 }}{{ end }}{{ end }}",
    "output": "{{ range 90000 }}" + "x" * 1000 + "{{ end }}",
    "doubling": '{{ $x := "aaaaaaaaaaaaaaaa" }}' + '{{ $x = printf "%s%s" $x $x }}' * 30 + "{{ $x }}",
}


@pytest.fixture(scope="module")
def server(tiny_store, tmp_path_factory):
    live = start_server(tmp_path_factory.mktemp("bomb"), tiny_store.root)
    yield live
    stop_server(live)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_template_bomb_is_a_fast_400_that_costs_no_memory(server, bomb):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        warm = client.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                                  "options": {"num_predict": 1}})
        assert warm.status_code == 200  # the model is loaded: what follows measures the template alone
        before = peak_rss_mb(server.process.pid)
        t0 = time.perf_counter()
        r = client.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                               "template": BOMBS[bomb]})
        elapsed = time.perf_counter() - t0
        grown = peak_rss_mb(server.process.pid) - before
    print(f"{bomb}: {r.status_code} in {elapsed * 1000:.1f} ms, peak RSS +{grown:.1f} MB")
    assert r.status_code == 400 and "template" in r.json()["error"], r.text
    assert grown < 50
    if bomb == "range":  # refused before its first iteration
        assert elapsed < 0.1 and "loops more than" in r.json()["error"]
    else:  # stopped at a limit: 100,000 iterations, 8 Mi characters (the 1 s time limit never comes into it)
        assert elapsed < 1.0


def test_a_modelfile_template_bomb_is_refused_at_create(server):
    r = httpx.post(server.url + "/api/create", json={"model": "bomb", "from": "tiny", "stream": False,
                                                      "template": BOMBS["range"]}, timeout=60)
    assert r.status_code == 400 and "loops more than" in r.json()["error"]

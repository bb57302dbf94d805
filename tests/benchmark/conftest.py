"""Start the scripted server (tests/benchmark/scripted_server.py) and read its log as the truth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmark.records import RequestRecord

ROOT = Path(__file__).resolve().parents[2]


def _ticks(pid: int | str) -> int:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def machine_ticks() -> int:
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return user + nice + system + irq + softirq + steal


class OthersLoad:
    """Cores kept busy by processes other than this test and its scripted servers, over a block."""

    def __init__(self, server_pids: list[int]) -> None:
        self.pids = ["self", *server_pids]

    def __enter__(self) -> OthersLoad:
        self.start = (machine_ticks(), sum(map(_ticks, self.pids)), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        machine, ours, t0 = self.start
        spent = (machine_ticks() - machine) - (sum(map(_ticks, self.pids)) - ours)
        self.cores = max(0, spent) / os.sysconf("SC_CLK_TCK") / (time.perf_counter() - t0)


class Scripted:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_rows(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def truth(self, prefix: str) -> tuple[list[RequestRecord], float]:
        """What the server did for requests whose id starts with ``prefix``: records and the duration."""
        rows = [r for r in self.log_rows() if r["id"].startswith(prefix)]
        records = []
        for row in rows:
            record = RequestRecord(request_id=row["id"], prompt_len=row.get("prompt_tokens", 0), expected_output_len=0,
                                   start_time=row["arrival"])
            if row["status"] == 200:
                sends = row["sends"]
                record.ttft = sends[0] - row["arrival"]
                record.itl = [b - a for a, b in zip(sends, sends[1:])]
                record.latency = sends[-1] - row["arrival"]
                record.output_tokens, record.success = row["completion_tokens"], True
            records.append(record)
        start = min(r["arrival"] for r in rows)
        end = max(r["sends"][-1] if r["status"] == 200 else r["arrival"] for r in rows)
        return records, end - start


def _scripted_servers(tmp: Path):
    """``start(script) -> Scripted`` for servers under ``tmp``; stopped when the generator is closed."""
    servers = []

    def start(script: list[dict]) -> Scripted:
        path = tmp / f"script{len(servers)}.json"
        log = tmp / f"log{len(servers)}.jsonl"
        path.write_text(json.dumps(script))
        proc = subprocess.Popen([sys.executable, "-m", "tests.benchmark.scripted_server", str(path), str(log)],
                                cwd=ROOT, stdout=subprocess.PIPE, text=True)
        server = Scripted(proc, int(proc.stdout.readline()), log)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.proc.terminate()
        server.proc.wait(timeout=10)
        server.proc.stdout.close()


@pytest.fixture
def scripted(tmp_path):
    yield from _scripted_servers(tmp_path)


@pytest.fixture(scope="module")
def scripted_module(tmp_path_factory):
    yield from _scripted_servers(tmp_path_factory.mktemp("scripted"))


def entry(ttft: float, gaps: list[float], chunk_tokens: list[int] | None = None, prompt_tokens: int = 32,
          status: int = 200) -> dict:
    return {"ttft": ttft, "gaps": gaps, "chunk_tokens": chunk_tokens or [1] * (len(gaps) + 1),
            "prompt_tokens": prompt_tokens, "status": status}

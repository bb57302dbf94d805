"""``infer run --verbose`` with speculative decoding (the native engine, a Modelfile's PARAMETER speculative):
the draft lines after Ollama's statistics, in process and through a server."""

from __future__ import annotations

import re

from registry.create import create_model
from registry.details import load_details
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from registry.store import Store
from tests.cli.test_run import infer_run, stat

PROMPT = "one two three four five six one two three four five six one two three four five six one two"


def test_verbose_shows_the_drafts(tmp_path, tiny_store, infer_home, monkeypatch):
    gguf = load_details(tiny_store, parse_name("tiny")).model_path
    local = Store(tmp_path / "models")
    text = (f"FROM {gguf}\nPARAMETER num_ctx 512\nPARAMETER temperature 0\nPARAMETER num_predict 40\n"
            "PARAMETER speculative ngram:k=4,adaptive=off\n")
    create_model(local, parse_name("spec"), parse_modelfile(text), tmp_path)
    monkeypatch.setenv("INFER_MODELS", str(local.root))
    result = infer_run("spec", PROMPT, "--verbose", "--engine", "native")
    assert result.returncode == 0, result.stderr
    drafted = int(stat(result.stderr, "draft tokens").split()[0])
    rate, accepted = re.fullmatch(r"(\d+\.\d)% \((\d+) accepted\)", stat(result.stderr, "draft acceptance")).groups()
    assert drafted > 0 and 0 <= int(accepted) <= drafted
    assert abs(float(rate) - 100 * int(accepted) / drafted) < 0.06
    labels = [line.split(":")[0] for line in result.stderr.splitlines() if ":" in line]
    assert labels[-2:] == ["draft tokens", "draft acceptance"]


def test_time_per_output_token_counts_tokens_not_chunks():
    """Through a server a chunk may carry a verify step's several tokens: TPOT is per token."""
    from core.base import Done, Timings, Usage
    from cli.chat_session import stats_lines

    timings = Timings(eval=1.0, total=1.2, ttft=0.1, token_times=[0.1, 0.4, 0.7, 1.1], draft_tokens=8,
                      accepted_tokens=6)
    lines = stats_lines(Done(finish_reason="stop", usage=Usage(input_tokens=5, output_tokens=11), timings=timings))
    assert "time per output token: 100ms" in lines
    assert "draft acceptance:     75.0% (6 accepted)" in lines

"""What one benchmark request sends and what the client saw of it (vLLM's ``RequestFuncInput/Output``).

All times are seconds on the client's monotonic clock (``time.perf_counter``). ``start_time`` is read
just before the POST; ``ttft`` ends at the first token chunk (``benchmark/clients.py`` says which chunks
count, as vLLM's benchmark does); ``itl`` holds the gaps between consecutive token chunks; ``latency``
ends at the last one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One prompt to send: its text (or chat messages), expected lengths, and whether they are exact."""

    prompt: str
    prompt_len: int
    output_len: int
    is_prompt_len_exact: bool = True


@dataclass(slots=True)
class RequestRecord:
    """The client's view of one request; ``output_tokens`` is ``None`` until known."""

    request_id: str
    prompt_len: int
    expected_output_len: int
    start_time: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int | None = None
    usage_source: str = "server"  # "server" (usage chunk / eval_count) or "estimated" (client re-tokenized)
    generated_text: str = ""
    success: bool = False
    error: str = ""
    server_prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when the server reports it

    @property
    def end_time(self) -> float:
        return self.start_time + self.latency

    def to_json(self) -> dict:
        row = asdict(self)
        row["end_time"] = self.end_time
        return row

"""SQLModel tables. The schema itself is built by ``gateway.migrations``; these classes read and write it."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlmodel import Field, SQLModel

ISO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def utc_iso(moment: datetime) -> str:
    """``2026-11-21T10:00:00.123456Z``: fixed width, so string order is time order.

    A naive datetime is taken as local time (as ``datetime.astimezone`` does).
    """
    return moment.astimezone(timezone.utc).strftime(ISO_FORMAT)


class UsageRecord(SQLModel):
    """A finished request, as the ledger stores it: who asked which model through which route,
    and how fast it answered. ``RequestLog`` adds the row's ``id`` and time on insert."""

    source: str = Field(description="gateway | cli | bench")
    route: str = Field(description="/v1/chat/completions, /api/chat, run, ...")
    model: str = Field(index=True)
    backend: str = Field(description="Adapter name: llamacpp, vllm, native, ...")
    stream: bool = False
    status: str = Field(default="ok", description="ok | error | cancelled | shed")
    client: str | None = Field(default=None, description="User agent or client host.")
    finish_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int | None = Field(default=None, description="Prompt tokens the backend served from its "
                                            "KV cache, as it reported them (NULL: not reported).")
    reasoning_tokens: int | None = Field(default=None, description="Of output_tokens, those spent thinking "
                                         "(NULL: no thinking reported or generated).")
    backend_reported_output_tokens: int | None = Field(
        default=None, description="A backend's own output count when it exceeded the cap the gateway enforced "
        "(it ignored max_tokens): an anomaly, never charged; output_tokens is what was forwarded (NULL: none).")
    usage_source: str | None = Field(default=None, description="Who counted the tokens: engine (in-process), "
                                     "backend (a remote server's report) or estimated (our tokenizer).")
    queue_ms: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    total_ms: float | None = None
    error: str | None = None
    route_name: str | None = Field(default=None, description="The SLO route the request named (routes:).")
    attempts: int | None = Field(default=None, description="Backends tried (retries and hedges included).")
    slo_met: bool | None = Field(default=None, description="Whether it met every SLO part; NULL without an SLO.")
    slo_missed: str | None = Field(default=None, description="The SLO parts missed: ttft, tpot, e2e.")
    input_cost_usd: float | None = Field(default=None, description="Uncached prompt tokens' cost (NULL: unpriced).")
    cached_input_cost_usd: float | None = None
    output_cost_usd: float | None = None
    reasoning_cost_usd: float | None = Field(default=None, description="The part of output_cost_usd spent on "
                                             "reasoning tokens.")
    total_cost_usd: float | None = None
    key_name: str | None = Field(default=None, description="The API key the request used (its name).")
    expected_cached_tokens: int | None = Field(default=None, description="Prompt tokens the route's prefix index "
                                               "expected cached on the backend that served (prefix and slo routes).")
    pricing_version: str | None = Field(default=None, description="Hash of the pricing entry used; hour-priced "
                                        "backends' costs are provisional until `infer cost` settles them.")
    prefill_backend: str | None = Field(default=None, description="Disaggregated: the worker that prefilled the "
                                        "prompt (backend decoded it); NULL when served co-located.")
    prefill_ms: float | None = Field(default=None, description="Disaggregated: the prefill leg's time.")
    prefill_cost_usd: float | None = Field(default=None, description="Disaggregated: the prompt's cost at the "
                                           "prefill worker's prices (input and cached input).")
    decode_cost_usd: float | None = Field(default=None, description="Disaggregated: the output's cost at the "
                                          "decode worker's prices.")


class RequestLog(UsageRecord, table=True):
    """One row of the ``requests`` table."""

    __tablename__ = "requests"  # type: ignore[assignment]

    id: str = Field(primary_key=True, max_length=26, description="ULID, sorts by time.")
    datetime_utc: str = Field(index=True, description="When the request ended (its row was written), ISO-8601 "
                              "UTC with a Z; it started total_ms earlier.")

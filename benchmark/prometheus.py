"""Scrape a target's Prometheus ``/metrics`` before and after a run and report the token counters' deltas.

Known counters: vLLM ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``, TGI
``tgi_request_input_length_sum`` / ``tgi_request_generated_tokens_sum``, ``infer serve``
``infer_input_tokens_total`` / ``infer_output_tokens_total`` (summed over labels); and speculative
decoding's, when the server speculates: vLLM ``vllm:spec_decode_num_drafts_total`` /
``…_num_draft_tokens_total`` / ``…_num_accepted_tokens_total``, ``infer serve`` the same under
``infer_spec_decode_``. A target without ``/metrics`` gives ``None``.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

_COUNTERS = {
    "input_tokens": ("vllm:prompt_tokens_total", "tgi_request_input_length_sum", "infer_input_tokens_total"),
    "output_tokens": ("vllm:generation_tokens_total", "tgi_request_generated_tokens_sum", "infer_output_tokens_total"),
    "spec_drafts": ("vllm:spec_decode_num_drafts_total", "infer_spec_decode_num_drafts_total"),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", "infer_spec_decode_num_draft_tokens_total"),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total", "infer_spec_decode_num_accepted_tokens_total"),
}


def scrape(base_url: str, *, timeout: float = 5.0) -> dict[str, float] | None:
    """Sample name -> value summed over label sets, or None when there is no usable /metrics."""
    try:
        resp = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(resp.text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    except ValueError:
        return None
    return totals


def server_token_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """{"input_tokens": Δ, "output_tokens": Δ, "source": metric names} from the first counters present."""
    if not before or not after:
        return None
    out: dict = {}
    for key, names in _COUNTERS.items():
        for name in names:
            if name in after:
                out[key] = int(round(after[name] - before.get(name, 0.0)))
                out[f"{key}_metric"] = name
                break
    return _with_acceptance(out) or None


def _with_acceptance(out: dict) -> dict:
    """Acceptance rate and mean acceptance length when the run verified drafts."""
    drafts, tokens, accepted = (out.get(k, 0) for k in ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens"))
    if tokens > 0:
        out["spec_acceptance_rate"] = accepted / tokens
    if drafts > 0:
        out["spec_mean_acceptance_length"] = 1 + accepted / drafts
    return out

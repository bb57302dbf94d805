"""``infer routes``: the live SLO view of a running ``infer serve`` (``GET /infer/routes``) as a table."""

from __future__ import annotations

import json

import httpx
import typer

from core.settings import ClientSettings, SettingsError, client_url


def register(app: typer.Typer) -> None:
    app.command("routes")(routes)


def routes(
    url: str = typer.Option(None, "--url", help="The server (default: INFER_HOST, else http://127.0.0.1:11434)."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON as served."),
) -> None:
    """Per route and backend: attainment, goodput, shed, errors, latency percentiles, predictions."""
    base = url or client_url()
    try:
        response = httpx.get(base.rstrip("/") + "/infer/routes", timeout=10, headers=ClientSettings.from_env().auth_headers)
    except httpx.HTTPError as exc:
        raise SettingsError(f"cannot reach infer serve at {base}: {exc}; is it running?") from None
    if response.status_code != 200:
        raise SettingsError(f"{base}/infer/routes answered {response.status_code}: {response.text[:200]}")
    data = response.json()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    if not data["routes"]:
        typer.echo("no routes: add a 'routes:' list to the --config file of infer serve")
        return
    for route in data["routes"]:
        typer.echo(_route_table(route))




def _route_table(route: dict) -> str:
    slo = route["slo"]
    parts = ", ".join(f"{k.removesuffix('_ms')} {v:g} ms" for k, v in slo.items() if k.endswith("_ms") and v)
    head = (f"route {route['name']} ({route['strategy']}{', shed' if route['sheds_early'] else ''}; SLO {parts or 'none'}, "
            f"target {slo['target']:.0%}, window {slo['window_s']:g} s)")
    header = ("", "requests", "good", "shed", "errors", "attain", "goodput/s", "ttft p50", "ttft p99",
              "tpot p50", "tpot p99", "pred ttft", "pred tpot", "ttft err", "tpot err", "in flight", "breaker")
    rows = [_row("(route)", route, None)] + [_row(b["name"], b, b) for b in route["backends"]]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, *rows]]
    note = (f"(predictions for a prompt of {route['predicted_for_prompt_tokens']} tokens, the median of the route's "
            "latest requests)") if "predicted_for_prompt_tokens" in route else None
    return "\n".join([head, *lines, *([note] if note else []), ""])


def _row(name: str, s: dict, backend: dict | None) -> tuple:
    fmt = lambda v, spec="{:.1f}": "-" if v is None else spec.format(v)  # noqa: E731
    return (name, s["requests"], s["good"], s["shed"], s["errors"], fmt(s["attainment"], "{:.1%}"),
            fmt(s["goodput_rps"], "{:.2f}"), fmt(s["ttft"]["p50"]), fmt(s["ttft"]["p99"]), fmt(s["tpot"]["p50"]),
            fmt(s["tpot"]["p99"]), fmt(backend and backend["predicted_ttft_ms"]),
            fmt(backend and backend["predicted_tpot_ms"]), fmt(s.get("prediction_error"), "{:.0%}"),
            fmt(s.get("tpot_prediction_error"), "{:.0%}"), "-" if backend is None else backend["in_flight"],
            "-" if backend is None else backend["breaker"])

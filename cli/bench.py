"""``infer bench``: load-test any LLM server with vLLM's metric definitions; ``infer bench compare``;
``infer bench report`` (one self-contained HTML file)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

app = typer.Typer(help="Benchmark a serving endpoint (vLLM's metrics, GuideLLM's profiles).",
                  invoke_without_command=True, no_args_is_help=True)


class _Bar:
    """A rich progress bar per load point, on stderr."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=False)
        self.task = None

    def start_point(self, label: str, total: int | None) -> None:
        self.task = self.progress.add_task(label, total=total, failed=0)

    def advance(self, record) -> None:
        failed = self.progress.tasks[-1].fields["failed"] + (0 if record.success else 1)
        self.progress.update(self.task, advance=1, failed=failed)


def _store_tokenizer(model: str) -> Path | None:
    from registry.details import load_details
    from registry.errors import RegistryError

    from .common import get_store

    try:
        store = get_store()
        details = load_details(store, store.resolve(model))
    except (RegistryError, OSError, ValueError):
        return None
    return details.model_path if details.gguf else None


@app.callback()
def bench(
    ctx: typer.Context,
    url: str = typer.Option(None, "--url", help="Server base URL, e.g. http://127.0.0.1:11434 (a trailing /v1 is "
                            "dropped)."),
    model: str = typer.Option(None, "--model", help="Model name sent in each request."),
    api: str = typer.Option("openai-chat", "--api", help="openai-chat | openai-completions | ollama-chat | "
                            "ollama-generate | anthropic-messages | openai-responses."),
    profile: str = typer.Option("synchronous", "--profile", help="synchronous | concurrent:N | rate:R | sweep | slo-search."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Arrival gamma shape: 1 = Poisson."),
    num_requests: int = typer.Option(20, "--num-requests", help="Requests per load point."),
    duration: float = typer.Option(None, "--duration", help="Seconds per load point instead of a request count."),
    warmup: int = typer.Option(1, "--warmup", help="Requests sent first and not counted."),
    input_tokens: str = typer.Option("256", "--input-tokens", help="Prompt tokens N or N:STDEV."),
    output_tokens: str = typer.Option(None, "--output-tokens", help="Output tokens N or N:STDEV (default 128)."),
    dataset: Path = typer.Option(None, "--dataset", help="ShareGPT-style JSON/JSONL prompts instead of synthetic ones."),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="tokenizer.json or .gguf (default: the store model's GGUF)."),
    goodput: list[str] = typer.Option(None, "--goodput", help="SLOs in ms, quoted or repeated: \"ttft:500 tpot:50 e2el:2000\"."),
    target_attainment: float = typer.Option(0.9, "--target-attainment", help="SLO attainment a load point must reach."),
    max_concurrency: int = typer.Option(64, "--max-concurrency", help="Cap for sweep's throughput point and slo-search."),
    sweep_size: int = typer.Option(10, "--sweep-size", help="Load points in a sweep (GuideLLM's default 10)."),
    price_per_hour: float = typer.Option(None, "--price-per-hour", help="$ per GPU-hour: adds $/Mtok in and out."),
    gpus: int = typer.Option(1, "--gpus", help="GPUs behind the endpoint."),
    extra_body: str = typer.Option(None, "--extra-body", help="JSON merged into every request body."),
    out: Path = typer.Option(None, "--out", help="Directory for requests.jsonl, summary.json/csv and plots "
                             "(default: $INFER_HOME/bench/<UTC time>, without plots)."),
    label: list[str] = typer.Option(None, "--label", help="KEY=VALUE stored in the summary (repeatable)."),
    seed: int = typer.Option(0, "--seed", help="Seed for prompts and arrivals."),
    shared_prefix: int = typer.Option(0, "--shared-prefix", help="Every other prompt starts with one shared prefix "
                                      "of N tokens: measures what a cached prompt token costs (cached_input_weight)."),
) -> None:
    """Run a benchmark against URL and print vLLM's summary block for each load point."""
    if ctx.invoked_subcommand:
        return
    from benchmark.session import run_bench

    if not url or not model:
        raise typer.BadParameter("--url and --model are required", param_hint="--url/--model")
    config = _config(locals())
    counter = _counter(tokenizer, model)
    bar = _Bar()
    try:
        with bar.progress:
            result = asyncio.run(run_bench(config, counter, bar))
    except ValueError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    _print_and_write(result, out)


def _config(opts: dict):
    from benchmark.clients import Endpoint
    from benchmark.config import BenchConfig, parse_extra_body, parse_goodput, parse_labels
    from benchmark.cost import Pricing
    from benchmark.profiles import Profile, SearchSettings
    from benchmark.prompts import LengthSpec

    try:
        search = SearchSettings(max_concurrency=opts["max_concurrency"], sweep_size=opts["sweep_size"],
                                burstiness=opts["burstiness"], goodput_slos=parse_goodput(opts["goodput"] or []) or None,
                                target_attainment=opts["target_attainment"])
        return BenchConfig(
            endpoint=Endpoint(opts["url"], opts["model"], opts["api"], extra_body=parse_extra_body(opts["extra_body"])),
            profile=Profile.parse(opts["profile"]), num_requests=opts["num_requests"], duration=opts["duration"],
            warmup=opts["warmup"], input_tokens=LengthSpec.parse(opts["input_tokens"]),
            output_tokens=LengthSpec.parse(opts["output_tokens"] or "128"),
            output_tokens_given=opts["output_tokens"] is not None, dataset=opts["dataset"], tokenizer=opts["tokenizer"],
            search=search, out=opts["out"], labels=parse_labels(opts["label"] or []), seed=opts["seed"],
            shared_prefix=opts["shared_prefix"],
            pricing=Pricing(opts["price_per_hour"], opts["gpus"]) if opts["price_per_hour"] is not None else None)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _counter(tokenizer: Path | None, model: str):
    from benchmark.tokenizer import TokenCounter

    path = tokenizer or _store_tokenizer(model)
    if path is None:
        typer.echo("warning: no tokenizer (--tokenizer, or a store model); prompt lengths are approximate", err=True)
        return None
    try:
        return TokenCounter.load(Path(path))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tokenizer") from None


def _print_and_write(result, out: Path | None) -> None:
    from benchmark.report import format_point, write_outputs

    for point, run in zip(result.points, result.runs):
        typer.echo(format_point(point))
        errors = [r.error for r in run.records if not r.success]
        if errors:
            typer.echo(f"{len(errors)} request(s) failed; the first: {errors[0]}")
    if result.config.profile.kind == "slo-search":
        from benchmark.profiles import best_passing_concurrency

        best = best_passing_concurrency(result.runs, result.config.goodput_slos or {}, result.config.search.target_attainment)
        typer.echo(f"largest concurrency meeting the SLO: {best if best is not None else 'none (1 already fails)'}")
    if not result.prompts_exact:
        typer.echo("note: prompt token counts are approximate (no tokenizer, or the text did not round-trip)")
    if out:
        from benchmark.plots import write_plots

        files = write_outputs(result, out) + write_plots(result, out)
    else:  # kept where output_weight: measured looks for the latest calibration
        from pricing.calibration import new_run_dir

        from .common import settings

        out = new_run_dir(settings().home)
        files = write_outputs(result, out)
    typer.echo(f"wrote {', '.join(f.name for f in files)} to {out}")
    records = [r for run in result.runs for r in run.records]
    if records and not any(r.success for r in records):  # nothing was measured: a failed run, not a result
        first = next(r.error for r in records if not r.success)
        typer.echo(f"Error: all {len(records)} requests failed; the first: {first}", err=True)
        raise typer.Exit(1)


@app.command("compare")
def compare(dirs: list[Path] = typer.Argument(..., help="Bench output directories (or summary.json files).")) -> None:
    """Print bench runs side by side, each at its best load point that meets its SLO."""
    from benchmark.compare import compare_table

    try:
        typer.echo(compare_table(dirs))
    except ValueError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command("report")
def report(dirs: list[Path] = typer.Argument(..., help="Bench output directories (or summary.json files)."),
           output: Path = typer.Option(Path("report.html"), "-o", "--output", help="The HTML file to write.")) -> None:
    """Write one self-contained HTML report (sweep curves, Pareto, TTFT/TPOT CDFs, the comparison table)."""
    from benchmark.html_report import write_report

    try:
        path = write_report(dirs, output)
    except (ValueError, OSError) as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {path} ({path.stat().st_size // 1024} KiB)")

"""``infer bench report``: two real bench runs (a sweep and a concurrency point against scripted
servers) become one HTML file with every chart inline; in a headless chromium with every network
request blocked, the page loads, makes no request, shows each chart and the comparison table with
the numbers of ``infer bench compare``. ``INFER_SCREENSHOTS=DIR`` saves ``DIR/bench-report.png``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.benchmark.test_cli import FAST, SLOW, _bench
from tests.browser import console_errors, save_screenshot

CHARTS = ("sweep", "pareto", "ttft-cdf", "tpot-cdf")


@pytest.fixture(scope="module")
def report(scripted_module, tmp_path_factory) -> tuple[Path, list[Path]]:
    """Built before the module's browser starts: ``infer bench`` runs an event loop of its own."""
    tmp_path = tmp_path_factory.mktemp("report")
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    result = _bench(scripted_module(FAST).url, fast, "--profile", "sweep", "--sweep-size", "4", "--max-concurrency",
                    "4", "--goodput", "ttft:100 tpot:50", "--price-per-hour", "2.5", "--label", "name=fast")
    assert result.exit_code == 0, result.output
    result = _bench(scripted_module(SLOW).url, slow, "--profile", "concurrent:3", "--goodput", "ttft:100 tpot:50",
                    "--price-per-hour", "2", "--label", "name=slow")
    assert result.exit_code == 0, result.output
    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["bench", "report", str(fast), str(slow), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}")
    return out, [fast, slow]


def test_the_report_is_one_file_with_every_chart_and_no_outside_reference(report):
    out, _ = report
    text = out.read_text()
    for chart in CHARTS:
        assert f'data-chart="{chart}"' in text
    assert text.count("<svg") == len(CHARTS)
    references = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)|url\(([^)]*)\)""", text)
    assert references and all((a or b).startswith("#") for a, b in references)  # within the page only
    assert "@import" not in text
    assert "<script" not in text and "<link" not in text
    assert out.stat().st_size < 400_000


def test_bad_directories_are_one_readable_line(tmp_path):
    result = CliRunner().invoke(app, ["bench", "report", str(tmp_path), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 1 and result.output.startswith("Error: cannot read bench summary")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.browser
def test_the_report_opens_offline_and_shows_every_chart(report, browser):
    out, dirs = report
    compare = CliRunner().invoke(app, ["bench", "compare", *map(str, dirs)]).output
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = console_errors(page)
    requested: list[str] = []

    def block(route):
        requested.append(route.request.url)
        return route.continue_() if route.request.url == out.as_uri() else route.abort()

    page.route("**/*", block)
    page.goto(out.as_uri())
    assert requested == [out.as_uri()] and errors == []
    for chart in CHARTS:
        svg = page.locator(f'figure[data-chart="{chart}"] svg')
        box = svg.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 200, chart
        assert svg.locator("path").count() > 5, chart
    cells = page.locator('table[data-table="compare"] tr').all_inner_texts()
    output_mtok = next(line for line in compare.splitlines() if line.startswith("output $/Mtok")).split()[2:]
    assert next(c for c in cells if c.startswith("output $/Mtok")).split()[2:] == output_mtok
    assert page.locator('table[data-table="points-0"] tbody tr').count() == 4
    if os.environ.get("INFER_SCREENSHOTS"):
        page.set_viewport_size({"width": 1280, "height": 1100})
        save_screenshot(page, Path(os.environ["INFER_SCREENSHOTS"]) / "bench-report.png", full_page=False)
    page.close()

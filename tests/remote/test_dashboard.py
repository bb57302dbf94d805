"""The dashboard through a live `infer serve --config` with SLO routes in front of priced fake vLLM
servers, `auth: {required: true}`, an operator key (INFER_API_KEYS) and a ledger key with a budget.

After a scripted workload (requests that meet and miss the SLO, sheds, a key's spend): the JSON
endpoints equal the ledger; a ledger key sees only its own rows and budget; and, in a headless
chromium, the page asks for a key, then renders every panel with no console error and shows the
numbers the JSON API answers. ``INFER_SCREENSHOTS=DIR`` saves the page as ``DIR/dashboard.png``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests.browser import console_errors, save_screenshot
from fakes import start_server as start_fake
from fakes.behaviour import Behaviour
from fakes.live import new_key

CHAT = [{"role": "user", "content": "name four letters"}]
OPERATOR = "operator-secret"
FAST_PRICE = {"input_per_mtok": 150.0, "output_per_mtok": 600.0}
SLOW_PRICE = {"input_per_mtok": 50.0, "output_per_mtok": 300.0}


@pytest.fixture(scope="module")
def fakes():
    fast = start_fake("vllm", Behaviour(token_delay=0.005))
    slow = start_fake("vllm", Behaviour(first_byte_delay=0.3, token_delay=0.01))
    try:
        yield fast, slow
    finally:
        fast.stop()
        slow.stop()


@pytest.fixture(scope="module")
def live(fakes, gateway_for):
    """(server, team key, (team key, ops key)) after the workload, with every row in the ledger."""
    fast, slow = fakes
    model = fast.behaviour.models[0]
    server = gateway_for(
        [{"name": "fast", "type": "vllm", "base_url": fast.url, "model": model, "pricing": FAST_PRICE},
         {"name": "slow", "type": "vllm", "base_url": slow.url, "model": model, "pricing": SLOW_PRICE}],
        routes=[{"name": "chat", "backends": ["slow", "fast"], "strategy": "round_robin",
                 "slo": {"ttft_ms": 200, "window_s": 600}},
                {"name": "strict", "backends": ["slow"], "slo": {"ttft_ms": 100, "window_s": 600}, "shed": True}],
        env={"INFER_API_KEYS": OPERATOR}, auth={"required": True})
    team, ops = new_key(server, "team", "--budget-usd", "5"), new_key(server, "ops")
    sent = workload(server, team, ops)
    wait_rows(server, sent)
    return server, team, (team, ops)


def workload(server, team: str, ops: str) -> int:
    """Chat requests on both backends (the slow one misses the TTFT SLO), by the team key (with a
    budget) and the ops key, then the strict route until it sheds. Returns the requests sent."""
    sent = 0
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for i in range(6):
            key = team if i % 2 == 0 else ops
            r = http.post("/v1/chat/completions", json={"model": "chat", "messages": CHAT, "max_tokens": 6},
                          headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            sent += 1
        for _ in range(12):
            r = http.post("/v1/chat/completions", json={"model": "strict", "messages": CHAT, "max_tokens": 2},
                          headers={"Authorization": f"Bearer {ops}"})
            sent += 1
            if r.status_code == 429:
                break
        assert r.status_code == 429
    return sent


def ledger(server, sql: str) -> list:
    db = sa.create_engine(server.db_url)
    try:
        with db.connect() as conn:
            return list(conn.execute(sa.text(sql)))
    finally:
        db.dispose()


def wait_rows(server, count: int) -> None:
    deadline = time.monotonic() + 10
    while ledger(server, "SELECT count(*) FROM requests")[0][0] < count:
        assert time.monotonic() < deadline, "the ledger did not get every row"
        time.sleep(0.1)


def get(server, path: str, key: str | None = OPERATOR, **params) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(server.url + path, params=params, headers=headers, timeout=30)


# -- the JSON ----------------------------------------------------------------------------------------


def test_recent_requests_are_the_ledger_rows_filtered(live):
    server = live[0]
    rows = get(server, "/infer/requests", since="1h", limit=500).json()["requests"]
    expected = ledger(server, "SELECT id, backend, status, input_tokens, output_tokens, ttft_ms, total_cost_usd "
                              "FROM requests ORDER BY id DESC")
    assert [(r["id"], r["backend"], r["status"], r["input_tokens"], r["output_tokens"], r["ttft_ms"],
             r["total_cost_usd"]) for r in rows] == [tuple(e) for e in expected]
    shed = get(server, "/infer/requests", route="strict", status="shed").json()["requests"]
    assert len(shed) == 1 and shed[0]["backend"] == "none" and shed[0]["route_name"] == "strict"
    fast = get(server, "/infer/requests", backend="fast").json()["requests"]
    assert fast and {r["backend"] for r in fast} == {"fast"}
    assert get(server, "/infer/requests", since="soon").status_code == 400
    assert get(server, "/infer/requests", limit=0).status_code == 400


def test_the_series_counts_every_row_once_with_the_ledger_percentiles(live):
    server = live[0]
    body = get(server, "/infer/series", since="15m", route="chat").json()
    totals = body["totals"]
    ok = sorted(r[0] for r in ledger(server, "SELECT ttft_ms FROM requests WHERE route_name = 'chat'"))
    met = ledger(server, "SELECT count(*) FROM requests WHERE route_name = 'chat' AND slo_met")[0][0]
    assert (totals["requests"], totals["good"], totals["judged"]) == (6, met, 6)
    assert totals["attainment"] == pytest.approx(met / 6)
    assert 2 <= met <= 4  # round robin: the slow backend misses the 200 ms TTFT SLO
    busy = [b for b in body["buckets"] if b["requests"]]
    if len(busy) == 1:  # the whole workload in one bucket: its p99 is the slowest TTFT
        assert busy[0]["ttft"]["p99"] == pytest.approx(ok[-1], abs=1e-3)
    assert sum(b["spend_usd"] for b in body["buckets"]) == pytest.approx(
        ledger(server, "SELECT sum(total_cost_usd) FROM requests WHERE route_name = 'chat'")[0][0])
    everything = get(server, "/infer/series", since="15m").json()["totals"]
    assert everything["shed"] == 1 and everything["requests"] == ledger(server, "SELECT count(*) FROM requests")[0][0]


def test_series_by_route_is_each_routes_own_series_from_one_request(live):
    server = live[0]
    grouped = get(server, "/infer/series", since="15m", step=60, by="route").json()
    names = sorted(r[0] for r in ledger(server, "SELECT DISTINCT route_name FROM requests WHERE route_name IS NOT NULL"))
    assert sorted(grouped["routes"]) == names and "chat" in names
    for name in names:
        alone = get(server, "/infer/series", since="15m", step=60, route=name).json()
        assert grouped["routes"][name]["totals"] == alone["totals"]
        assert [b["requests"] for b in grouped["routes"][name]["buckets"]][-3:] == [b["requests"] for b in alone["buckets"]][-3:]
    assert get(server, "/infer/series", by="backend").status_code == 400


def test_series_by_route_lists_every_configured_route_also_one_without_rows(live):
    server, team, _ = live  # the team key sent no request to "strict"
    grouped = get(server, "/infer/series", key=team, since="15m", step=60, by="route").json()
    assert sorted(grouped["routes"]) == ["chat", "strict"]
    strict = grouped["routes"]["strict"]
    assert strict["totals"]["requests"] == 0 and len(strict["buckets"]) == len(grouped["buckets"])
    assert all(b["requests"] == 0 for b in strict["buckets"])
    assert grouped["routes"]["chat"]["totals"]["requests"] == grouped["totals"]["requests"] == 3


def test_keys_show_budget_use_and_a_ledger_key_sees_only_itself(live):
    server, team, _ = live
    assert get(server, "/infer/keys", key=None).status_code == 401
    everyone = get(server, "/infer/keys").json()["keys"]
    assert [k["name"] for k in everyone] == ["ops", "team"] and everyone[0]["budget_used"] is None
    key = everyone[1]
    assert [k["name"] for k in get(server, "/infer/keys", key=team).json()["keys"]] == ["team"]
    spent = ledger(server, "SELECT sum(total_cost_usd), count(*) FROM requests WHERE key_name = 'team'")[0]
    assert key["name"] == "team" and key["requests"] == spent[1] == 3
    assert key["spend_usd"] == pytest.approx(spent[0]) and key["spent_usd"] == pytest.approx(spent[0])
    assert key["budget_used"] == pytest.approx((key["spent_usd"] + key["reserved_usd"]) / 5)
    own = get(server, "/infer/requests", key=team).json()["requests"]
    assert len(own) == 3 and {r["key_name"] for r in own} == {"team"}
    assert get(server, "/infer/series", key=team).json()["totals"]["requests"] == 3
    assert get(server, "/infer/requests", key="sk-infer-nope").status_code == 401


def test_the_page_needs_no_key_its_data_does(live):
    server = live[0]
    bare = httpx.get(server.url + "/dashboard")  # the page itself, not an empty redirect
    page = httpx.get(server.url + "/dashboard/")  # INFER_API_KEYS is set: every other path needs a key
    assert page.status_code == bare.status_code == 200 and "<title>infer · dashboard</title>" in page.text
    assert bare.text == page.text and 'src="/dashboard/dashboard.js"' in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    script = httpx.get(server.url + "/dashboard/dashboard.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert httpx.get(server.url + "/dashboard/secrets.txt").status_code == 404
    assert get(server, "/infer/series", key=None).status_code == 401
    views = get(server, "/infer/dashboard").json()["views"]
    paths = {p for p in httpx.get(server.url + "/openapi.json", headers={"Authorization": f"Bearer {OPERATOR}"}
                                  ).json()["paths"]}
    assert views == {"backends": "/infer/backends" in paths}


# -- the page, in a browser --------------------------------------------------------------------------


def shown(page, key: str) -> str:
    return page.locator(f'[data-k="{key}"]').first.inner_text()


def until(condition, timeout: float = 5.0) -> None:
    """Poll ``condition`` (the page's CSP forbids Playwright's eval-based waits)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the page did not update"
        time.sleep(0.05)


def pct(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


@pytest.mark.browser
def test_the_page_shows_what_the_json_says(live, browser, fakes):
    server = live[0]
    page = browser.new_page(viewport={"width": 1360, "height": 1500})
    page.set_default_timeout(5000)
    errors = console_errors(page)
    page.goto(server.url + "/dashboard?window=15m&refresh=0")
    page.wait_for_selector("#key-form:not([hidden])")
    assert all("401" in e for e in errors), errors  # the browser logs the refused poll itself
    errors.clear()
    page.fill("#key", OPERATOR)
    page.click("#key-form button")
    page.wait_for_selector('[data-route="chat"]')
    assert_routes(page, server)
    assert_backends_health(page, server)
    assert_cost_and_keys(page, server)
    recent = get(server, "/infer/requests", since="15m").json()["requests"]
    assert page.locator("#requests tbody tr").count() == len(recent)
    assert shown(page, f"request.{recent[0]['id']}.status") == recent[0]["status"]
    for chart in ("ttft", "tpot", "e2e", "traffic", "spend"):
        assert page.locator(f"#chart-{chart} svg path.line, #chart-{chart} svg circle").count() >= 1, chart
    assert page.locator("#chart-price svg rect").count() == 4  # two priced backends, in and out
    page.select_option("#series-route", "chat")
    page.wait_for_selector("#chart-ttft svg line.slo[data-slo='200']", state="attached")
    page.select_option("#f-status", "shed")
    until(lambda: page.locator("#requests tbody tr").count() == 1)
    page.select_option("#f-status", "")
    until(lambda: page.locator("#requests tbody tr").count() == len(recent))
    assert errors == []
    if os.environ.get("INFER_SCREENSHOTS"):  # 90 s of changing load first, so the charts have a shape
        traffic(server, live[2], fakes, seconds=float(os.environ.get("INFER_SCREENSHOT_TRAFFIC_S", "90")))
        page.set_viewport_size({"width": 1280, "height": 1060})
        page.select_option("#window", "2m")
        page.select_option("#series-route", "chat")
        time.sleep(1.0)
        save_screenshot(page, Path(os.environ["INFER_SCREENSHOTS"]) / "dashboard.png", full_page=False)
        assert errors == []
    page.close()


@pytest.mark.browser
def test_a_ledger_key_sees_its_own_rows_and_no_cost_report(live, browser):
    """The cost report covers every key: a ledger key's page shows its own requests and budget, and
    says the cost table needs an operator key instead of failing the refresh."""
    server, team = live[0], live[1]
    page = browser.new_page(viewport={"width": 1360, "height": 1500})
    page.set_default_timeout(5000)
    errors = console_errors(page)
    page.goto(server.url + "/dashboard?window=15m&refresh=0")
    page.wait_for_selector("#key-form:not([hidden])")
    errors.clear()  # the refused first poll (401)
    page.fill("#key", team)
    page.click("#key-form button")
    page.wait_for_selector('[data-route="chat"]')
    own = get(server, "/infer/requests", key=team, since="15m").json()["requests"]
    assert page.locator("#requests tbody tr").count() == len(own) == 3
    assert [k["name"] for k in get(server, "/infer/keys", key=team).json()["keys"]] == ["team"]
    assert page.locator("#keys tbody tr").count() == 1
    assert "operator key" in page.locator("#cost tbody").inner_text()
    assert all("403" in e for e in errors), errors  # the browser logs the refused cost poll itself
    page.close()


def assert_routes(page, server) -> None:
    routes = {r["name"]: r for r in get(server, "/infer/routes").json()["routes"]}
    assert routes["chat"]["requests"] == 6 and routes["strict"]["shed"] == 1
    assert any(b["tpot_prediction_error"] is not None for b in routes["chat"]["backends"])
    for name, route in routes.items():
        for field in ("requests", "good", "shed", "errors"):
            assert shown(page, f"route.{name}.{field}") == str(route[field]), (name, field)
        assert shown(page, f"route.{name}.attainment") == pct(route["attainment"])
        assert float(shown(page, f"route.{name}.goodput_rps")) == pytest.approx(route["goodput_rps"], rel=0.3)
        window = get(server, "/infer/series", since="15m", route=name).json()["totals"]
        assert shown(page, f"route.{name}.window_attainment") == pct(window["attainment"])
        for b in route["backends"]:
            assert shown(page, f"backend.{name}.{b['name']}.breaker") == b["breaker"]
            assert shown(page, f"backend.{name}.{b['name']}.in_flight") == str(b["in_flight"])
            for field in ("prediction_error", "tpot_prediction_error"):  # fixed once the traffic has ended
                assert shown(page, f"backend.{name}.{b['name']}.{field}") == pct(b[field]), (name, b["name"], field)


def assert_backends_health(page, server) -> None:
    """Up/down and KV-cache use as ``GET /infer/backends`` says, where the server has it."""
    if not get(server, "/infer/dashboard").json()["views"]["backends"]:
        return
    page.click("#refresh-now")  # the monitor's figures change on their own: read both now
    monitor = {b["name"]: b for b in get(server, "/infer/backends").json()["backends"]}
    page.wait_for_selector('[data-k="backend.chat.fast.kv_cache"]')
    for name in ("fast", "slow"):
        assert shown(page, f"backend.chat.{name}.kv_cache") == pct(monitor[name]["kv_cache_usage"])
        assert shown(page, f"backend.chat.{name}.up") == ("up" if monitor[name]["up"] else "down")


def assert_cost_and_keys(page, server) -> None:
    for group in get(server, "/infer/cost", since="15m", by="backend").json()["groups"]:
        for field in ("usd_per_mtok_input", "usd_per_mtok_output"):
            assert shown(page, f"cost.{group['key']}.{field}") == ("—" if group[field] is None else f"{group[field]:.4f}")
        assert shown(page, f"cost.{group['key']}.total_cost_usd") == f"{group['total_cost_usd']:.6f}"
    key = get(server, "/infer/keys", since="15m").json()["keys"][1]
    assert shown(page, "key.team.budget_used") == pct(key["budget_used"])
    assert shown(page, "key.team.spent_usd") == f"{key['spent_usd']:.6f}"


def traffic(server, keys: tuple[str, str], fakes, seconds: float) -> None:
    """Bursts of 1 to 4 concurrent chat requests every 0.3 s while the slow backend's first token
    takes 0.1, 0.25 then 0.4 s, and a strict request now and then."""
    from concurrent.futures import ThreadPoolExecutor

    slow = fakes[1].behaviour
    end, i = time.monotonic() + seconds, 0
    with ThreadPoolExecutor(4) as pool, httpx.Client(base_url=server.url, timeout=30) as http:
        def post(model: str, key: str) -> None:
            http.post("/v1/chat/completions", json={"model": model, "messages": CHAT, "max_tokens": 8},
                      headers={"Authorization": f"Bearer {key}"})
        try:
            while time.monotonic() < end:
                phase = int(3 * (1 - (end - time.monotonic()) / seconds))
                slow.first_byte_delay = (0.1, 0.25, 0.4)[min(phase, 2)]
                burst = [pool.submit(post, "chat", keys[j % 2]) for j in range(1 + i % 4)]
                if i % 5 == 0:
                    burst.append(pool.submit(post, "strict", keys[1]))
                for future in burst:
                    future.result()
                i += 1
                time.sleep(0.3)
        finally:
            slow.first_byte_delay = 0.3

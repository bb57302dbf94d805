"""API keys through a live `infer serve`: 100 concurrent requests against a budget that fits 10 never
overspend it, per-minute limits answer 429 with Retry-After and the remaining counts, unknown and
revoked keys are 401, a key's routes are enforced, `auth: {required: true}` closes the door, and
rows carry the key's name."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest
import sqlalchemy as sa

from fakes import start_server as start_fake
from fakes.behaviour import Behaviour
from tests.servers import wait_for
from fakes.live import new_key

CHAT = [{"role": "user", "content": "name four letters"}]
PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}  # a request of ~10 + 8 tokens: ~$0.018


@pytest.fixture(scope="module")
def fake():
    server = start_fake("vllm", Behaviour(token_delay=0.01))
    try:
        yield server
    finally:
        server.stop()


def post(server, key: str | None, model: str = "priced", **extra) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "messages": CHAT, "max_tokens": 8, **extra}
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def server(fake, gateway_for):
    model = fake.behaviour.models[0]
    return gateway_for([{"name": "priced", "type": "vllm", "base_url": fake.url, "model": model, "pricing": PRICE},
                        {"name": "other", "type": "vllm", "base_url": fake.url, "model": model}])


def spent(server, name: str) -> tuple[float, float, float]:
    db = sa.create_engine(server.db_url)
    try:
        with db.connect() as conn:
            row = conn.execute(sa.text("SELECT spent_usd, reserved_usd, budget_usd FROM api_keys WHERE name = :n"),
                               {"n": name}).one()
    finally:
        db.dispose()
    return tuple(row)


def test_100_concurrent_requests_never_overspend_a_budget_that_fits_10(server):
    one = post(server, None)
    assert one.status_code == 200
    cost = float(one.headers["x-infer-cost-usd"])  # what such a request costs
    key = new_key(server, "team", "--budget-usd", f"{cost * 10 * 2.2:.6f}")  # reservations count max_tokens

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            body = {"model": "priced", "messages": CHAT, "max_tokens": 8}
            return await asyncio.gather(*(client.post(server.url + "/v1/chat/completions", json=body,
                                                      headers={"Authorization": f"Bearer {key}"})
                                          for _ in range(100)))
    answers = asyncio.run(run())
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert len(ok) + len(refused) == 100 and 0 < len(ok) < 100
    assert "over budget" in refused[0].json()["error"]["message"]
    deadline = time.monotonic() + 10
    while spent(server, "team")[1] > 1e-12 and time.monotonic() < deadline:
        time.sleep(0.1)
    used, reserved, budget = spent(server, "team")
    assert used <= budget + 1e-9 and reserved == pytest.approx(0, abs=1e-12)
    assert used == pytest.approx(sum(float(r.headers["x-infer-cost-usd"]) for r in ok), rel=1e-6)
    # The reservation overlaps the backend's first byte: a refused request's backend call is cancelled,
    # its client gets only the 429, and it still has exactly one row (an error saying why).
    assert all("choices" not in r.json() for r in refused)
    assert wait_for(lambda: len(key_rows(server, "team")) == 100)
    rows = key_rows(server, "team")
    statuses = [status for status, _ in rows]
    assert statuses.count("ok") == len(ok) and statuses.count("error") == len(refused)
    assert all("over budget" in error for status, error in rows if status == "error")


def key_rows(server, name: str) -> list[tuple[str, str | None]]:
    db = sa.create_engine(server.db_url)
    try:
        with db.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text("SELECT status, error FROM requests WHERE key_name = :n"),
                                                   {"n": name})]
    finally:
        db.dispose()


def test_requests_per_minute(server):
    key = new_key(server, "burst", "--rpm", "3")
    codes = [post(server, key).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = post(server, key)
    assert 1 <= float(r.headers["retry-after"]) <= 60 and r.headers["x-ratelimit-remaining-requests"] == "0"


def test_unknown_revoked_and_out_of_route_keys(server):
    assert post(server, "sk-infer-nope").status_code == 401
    key = new_key(server, "narrow", "--routes", "priced")
    assert post(server, key).status_code == 200
    assert post(server, key, model="other").status_code == 403
    done = subprocess.run([sys.executable, "-m", "cli", "keys", "revoke", "narrow", "--db", server.db_url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    time.sleep(2.5)  # the server caches a key for 2 s
    assert post(server, key).status_code == 401


def test_rows_carry_the_key_name(server):
    key = new_key(server, "tagged")
    assert post(server, key).status_code == 200
    db = sa.create_engine(server.db_url)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with db.connect() as conn:
                names = [r[0] for r in conn.execute(sa.text("SELECT key_name FROM requests WHERE key_name = 'tagged'"))]
            if names:
                break
            time.sleep(0.1)
    finally:
        db.dispose()
    assert names == ["tagged"]


def test_auth_required_needs_a_key_even_on_loopback(fake, gateway_for):
    model = fake.behaviour.models[0]
    server = gateway_for([{"name": "m", "type": "vllm", "base_url": fake.url, "model": model}], auth={"required": True})
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "m", "messages": CHAT, "max_tokens": 2})
    assert r.status_code == 401 and "requires an API key" in r.json()["error"]["message"]
    key = new_key(server, "door")
    assert post(server, key, model="m").status_code == 200


@pytest.mark.slow  # a real PostgreSQL/Redis, or seconds of waiting: make test-slow (CI runs it)
def test_two_replicas_on_one_postgres_keep_one_budget(fake, gateway_for, postgres):
    model = fake.behaviour.models[0]
    env = {"INFER_DATABASE_URL": postgres.url}
    replicas = [gateway_for([{"name": "priced", "type": "vllm", "base_url": fake.url, "model": model,
                              "pricing": PRICE}], env=env) for _ in range(2)]
    cost = float(post(replicas[0], None).headers["x-infer-cost-usd"])
    key = new_key(replicas[0], "shared", "--budget-usd", f"{cost * 10 * 2.2:.6f}")

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=100), timeout=60) as client:
            body = {"model": "priced", "messages": CHAT, "max_tokens": 8}
            return await asyncio.gather(*(client.post(replicas[i % 2].url + "/v1/chat/completions", json=body,
                                                      headers={"Authorization": f"Bearer {key}"})
                                          for i in range(100)))
    answers = asyncio.run(run())
    ok = [r for r in answers if r.status_code == 200]
    assert 0 < len(ok) < 100 and all(r.status_code in (200, 429) for r in answers)
    assert {r.url.port for r in answers} == {replicas[0].port, replicas[1].port}  # both took part (which one
    # admits the ten that fit depends on the machine's scheduling, so each need not have served some)
    assert wait_for(lambda: spent(replicas[0], "shared")[1] < 1e-12)
    used, _, budget = spent(replicas[0], "shared")
    assert used <= budget + 1e-9
    assert used == pytest.approx(sum(float(r.headers["x-infer-cost-usd"]) for r in ok), rel=1e-6)


@pytest.mark.slow  # a real PostgreSQL/Redis, or seconds of waiting: make test-slow (CI runs it)
def test_two_replicas_share_requests_per_minute_through_redis(fake, gateway_for, redis_server, tmp_path):
    """A sliding window shared in Redis: 5 requests a minute over both replicas, whenever the minute
    started; the 6th waits for the first to be 60 s old (Retry-After says so), not for the clock's minute."""
    model = fake.behaviour.models[0]
    db_url = f"sqlite:///{tmp_path / 'shared.db'}"
    env = {"INFER_REDIS_URL": redis_server.url, "INFER_DATABASE_URL": db_url}
    replicas = [gateway_for([{"name": "priced", "type": "vllm", "base_url": fake.url, "model": model}], env=env)
                for _ in range(2)]
    key = new_key(replicas[0], "shared-rpm", "--rpm", "5")
    started = time.monotonic()
    codes = [post(replicas[i % 2], key).status_code for i in range(8)]
    assert codes.count(200) == 5 and codes.count(429) == 3, codes
    refused = post(replicas[1], key)
    assert refused.status_code == 429 and refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert 60 - (time.monotonic() - started) - 2 <= float(refused.headers["retry-after"]) <= 60


@pytest.mark.slow
def test_requests_per_minute_hold_across_a_minute_boundary(fake, gateway_for, redis_server, tmp_path):
    """The red team's finding: --rpm 10 let 20 requests through in 16 s across a minute boundary."""
    model = fake.behaviour.models[0]
    env = {"INFER_REDIS_URL": redis_server.url, "INFER_DATABASE_URL": f"sqlite:///{tmp_path / 'shared.db'}"}
    server = gateway_for([{"name": "priced", "type": "vllm", "base_url": fake.url, "model": model}], env=env)
    key = new_key(server, "boundary", "--rpm", "10")
    time.sleep((55 - time.time() % 60) % 60)  # 5 s before a minute starts
    first = [post(server, key).status_code for _ in range(10)]
    time.sleep(max(0.0, 61 - time.time() % 60) if time.time() % 60 > 30 else 1.0)  # into the next minute
    second = [post(server, key).status_code for _ in range(10)]
    assert first.count(200) == 10 and second.count(200) == 0, (first, second)


@pytest.mark.slow  # a real PostgreSQL/Redis, or seconds of waiting: make test-slow (CI runs it)
def test_two_replicas_share_tokens_per_minute_through_redis(fake, gateway_for, redis_server, tmp_path):
    """One key's 1,000 tokens a minute over both replicas. A request is charged its prompt (an upper
    bound: no tokenizer is configured) and its max_tokens when admitted, and its actual tokens when it
    ends; what either replica served counts for both, and the one that would pass the limit is
    refused by both with Retry-After and the tokens left."""
    model = fake.behaviour.models[0]
    env = {"INFER_REDIS_URL": redis_server.url, "INFER_DATABASE_URL": f"sqlite:///{tmp_path / 'shared.db'}"}
    replicas = [gateway_for([{"name": "priced", "type": "vllm", "base_url": fake.url, "model": model}], env=env)
                for _ in range(2)]
    key = new_key(replicas[0], "shared-tpm", "--tpm", "1000")
    answers = []
    for i in range(80):
        r = post(replicas[i % 2], key)
        answers.append(r)
        if r.status_code != 200:
            break
    ok = [r for r in answers if r.status_code == 200]
    served = sum(r.json()["usage"]["total_tokens"] for r in ok)
    assert len(ok) >= 2 and {r.url.port for r in ok} == {replicas[0].port, replicas[1].port}
    assert answers[-1].status_code == 429 and served <= 1000, [r.status_code for r in answers]
    for replica in replicas:  # both see what both served
        refused = post(replica, key)
        assert refused.status_code == 429 and "1000 tokens per minute" in refused.json()["error"]["message"]
        assert 1 <= float(refused.headers["retry-after"]) <= 60
        assert 0 <= int(refused.headers["x-ratelimit-remaining-tokens"]) < 1000 - served + 200


def test_auth_required_guards_the_gateway_views(fake, gateway_for):
    """With auth required, /infer/routes and /infer/backends need a key, and /infer/cost (every key's
    spend) an operator key; `infer routes` sends INFER_API_KEY."""
    model = fake.behaviour.models[0]
    server = gateway_for([{"name": "m", "type": "vllm", "base_url": fake.url, "model": model}],
                         routes=[{"name": "chat", "backends": ["m"], "slo": {"ttft_ms": 500}}],
                         env={"INFER_API_KEYS": "operator-secret"}, auth={"required": True})
    key = new_key(server, "viewer")
    for path in ("/infer/routes", "/infer/backends", "/infer/cost"):
        r = httpx.get(server.url + path, timeout=10)
        assert r.status_code == 401, (path, r.text)
    as_key = {"Authorization": f"Bearer {key}"}
    assert httpx.get(server.url + "/infer/routes", headers=as_key, timeout=10).json()["routes"][0]["name"] == "chat"
    assert httpx.get(server.url + "/infer/backends", headers=as_key, timeout=10).status_code == 200
    r = httpx.get(server.url + "/infer/cost", headers=as_key, timeout=10)
    assert r.status_code == 403 and "operator key" in r.json()["error"]
    as_x_api_key = {"x-api-key": "operator-secret"}  # Anthropic's SDKs send the key so
    assert httpx.get(server.url + "/infer/cost", headers=as_x_api_key, timeout=10).json()["by"] == "backend"
    operator = {"Authorization": "Bearer operator-secret"}
    assert httpx.get(server.url + "/infer/cost", headers=operator, timeout=10).json()["by"] == "backend"
    cli = [sys.executable, "-m", "cli", "routes", "--url", server.url]
    refused = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "401" in refused.stderr
    shown = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "INFER_API_KEY": key})
    assert shown.returncode == 0 and "chat" in shown.stdout, shown.stderr

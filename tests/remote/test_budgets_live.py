"""Budgets and limits on live ``infer serve`` replicas with a remote backend, PostgreSQL and Redis,
and what happens when PostgreSQL or Redis goes away (their own throwaway servers, stopped and started
again by the tests: ``tests/servers.py``).

- 50 concurrent requests without max tokens, over two replicas sharing PostgreSQL: the key never
  spends more than its budget (each holds its prompt's upper bound and the configured context left);
- Redis down: a key with per-minute limits gets 503 with Retry-After (or goes on, with
  ``rate_limits_fail_open``), each request still has its ledger row, the connection stays usable,
  and the server logs the outage once;
- PostgreSQL down: a request that needs a budget hold gets 503 with Retry-After, a key with no
  budget is served from the key cache, the rows are written once the database is back, holds whose
  release failed do not stay, and the outage is logged once.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import sqlalchemy as sa

import tests.servers
from fakes import start_server as start_fake
from fakes.behaviour import Behaviour
from tests.servers import wait_for
from fakes.live import new_key

CHAT = [{"role": "user", "content": "name four letters"}]
PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}
CONTEXT = 400  # the backend's context_length in the config: a request without max tokens may fill it


def throwaway(kind: str):
    try:
        server = getattr(tests.servers, kind)()
    except FileNotFoundError as exc:
        pytest.skip(f"{exc} (CI installs it in .ci/run)")
    return server


@pytest.fixture(scope="module")
def pg():
    server = throwaway("Postgres")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rd():
    server = throwaway("Redis")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fake():
    server = start_fake("vllm", Behaviour(token_delay=0.002))
    try:
        yield server
    finally:
        server.stop()


def backend(fake, **extra) -> dict:
    return {"name": "priced", "type": "vllm", "base_url": fake.url, "model": fake.behaviour.models[0],
            "pricing": PRICE, "context_length": CONTEXT, **extra}


def query(url: str, sql: str, **params) -> list[tuple]:
    db = sa.create_engine(url)
    try:
        with db.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        db.dispose()


def chat(client: httpx.Client | httpx.AsyncClient, server, key: str, **extra):
    return client.post(server.url + "/v1/chat/completions", json={"model": "priced", "messages": CHAT, **extra},
                       headers={"Authorization": f"Bearer {key}"})


@pytest.mark.slow  # a real PostgreSQL/Redis, or seconds of waiting: make test-slow (CI runs it)
def test_two_replicas_on_postgres_50_concurrent_without_max_tokens(fake, gateway_for, pg):
    url = pg.url
    replicas = [gateway_for([backend(fake)], env={"INFER_DATABASE_URL": url}) for _ in range(2)]
    key = new_key(replicas[0], "shared-race", "--budget-usd", "1.5")  # a request holds up to $0.4

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=50), timeout=60) as client:
            return await asyncio.gather(*(chat(client, replicas[i % 2], key) for i in range(50)))
    answers = asyncio.run(run())
    ok = [r for r in answers if r.status_code == 200]
    assert 0 < len(ok) < 50 and all(r.status_code in (200, 429) for r in answers)
    assert sum(r.json()["usage"]["completion_tokens"] for r in ok) > 300  # no max: they ran to the context
    assert wait_for(lambda: query(url, "SELECT count(*) FROM key_holds WHERE key_name = 'shared-race'")[0][0] == 0)
    spent, reserved = query(url, "SELECT spent_usd, reserved_usd FROM api_keys WHERE name = 'shared-race'")[0]
    assert spent <= 1.5 + 1e-9 and reserved == pytest.approx(0.0, abs=1e-12)
    assert spent == pytest.approx(sum(float(r.headers["x-infer-cost-usd"]) for r in ok), rel=1e-6)
    assert wait_for(lambda: query(url, "SELECT count(*) FROM requests WHERE key_name = 'shared-race'")[0][0] == 50)
    priced_refusals = query(url, "SELECT count(*) FROM requests WHERE key_name = 'shared-race' AND status <> 'ok' "
                                 "AND (total_cost_usd > 0 OR output_tokens > 0)")[0][0]
    assert priced_refusals == 0  # refused before anything ran: nothing to price
    assert len(fake.behaviour.requests) >= len(ok)


def outage_lines(server, what: str) -> tuple[int, int]:
    log = server.log()
    assert "Task exception was never retrieved" not in log and "Exception in ASGI application" not in log, log[-3000:]
    return log.count(f"{what} is unreachable"), log.count(f"{what} is back after")


@pytest.mark.slow  # a real PostgreSQL/Redis, or seconds of waiting: make test-slow (CI runs it)
@pytest.mark.parametrize("fail_open", [False, True])
def test_redis_outage(fake, gateway_for, rd, tmp_path, fail_open):
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    server = gateway_for([backend(fake)], env={"INFER_REDIS_URL": rd.url, "INFER_DATABASE_URL": db_url},
                         auth={"rate_limits_fail_open": fail_open})
    key = new_key(server, "limited", "--rpm", "1000")
    with httpx.Client(timeout=30) as client:  # one keep-alive connection for every request
        assert chat(client, server, key, max_tokens=2).status_code == 200
        rd.pause()
        try:
            during = [chat(client, server, key, max_tokens=2) for _ in range(6)]
        finally:
            rd.resume()
        after = chat(client, server, key, max_tokens=2)
    if fail_open:
        assert [r.status_code for r in during] == [200] * 6
    else:
        assert [r.status_code for r in during] == [503] * 6
        assert all(int(r.headers["retry-after"]) >= 1 and "Redis" in r.json()["error"]["message"] for r in during)
    assert after.status_code == 200
    assert wait_for(lambda: query(db_url, "SELECT count(*) FROM requests WHERE key_name = 'limited'")[0][0] == 8)
    assert outage_lines(server, "Redis (per-key rate limits)") == (1, 1)


@pytest.mark.slow  # a real PostgreSQL/Redis, or seconds of waiting: make test-slow (CI runs it)
def test_postgres_outage(fake, gateway_for, pg):
    url = pg.url
    fake.behaviour.token_delay = 0.02
    server = gateway_for([backend(fake)], env={"INFER_DATABASE_URL": url, "INFER_HOLD_TTL_S": "4"})
    budgeted = new_key(server, "budgeted", "--budget-usd", "1")  # too small for a lease: a hold per request
    free = new_key(server, "free")

    async def in_flight() -> list[httpx.Response]:  # holds made before the outage, released during it
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(chat(client, server, budgeted, max_tokens=40) for _ in range(3)))

    stopper = threading.Thread(target=lambda: (time.sleep(0.3), pg.pause()))
    with httpx.Client(timeout=60) as client:  # one keep-alive connection for the requests below
        assert chat(client, server, free, max_tokens=2).status_code == 200  # the key is now in the cache
        stopper.start()
        answers = asyncio.run(in_flight())  # 40 tokens at 20 ms: they end while the database is down
        stopper.join()
        try:
            time.sleep(2.5)  # past the key cache
            refused = chat(client, server, budgeted, max_tokens=2)
            served = chat(client, server, free, max_tokens=2)
        finally:
            pg.resume()
        assert [r.status_code for r in answers] == [200] * 3
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert "database" in refused.json()["error"]["message"]
        assert served.status_code == 200  # no budget: the key as last read is enough
        assert wait_for(lambda: chat(client, server, budgeted, max_tokens=2).status_code == 200, timeout=20)
    assert wait_for(lambda: query(url, "SELECT count(*) FROM requests WHERE key_name IN ('budgeted', 'free')")[0][0]
                    >= 7, timeout=20)  # the rows of the outage were written when it ended
    assert wait_for(lambda: query(url, "SELECT count(*) FROM key_holds")[0][0] == 0, timeout=20)
    spent, reserved = query(url, "SELECT spent_usd, reserved_usd FROM api_keys WHERE name = 'budgeted'")[0]
    assert reserved == pytest.approx(0.0, abs=1e-12) and spent > 0
    assert outage_lines(server, "the ledger database (API keys and budgets)") == (1, 1)
    assert server.log().count("usage ledger: the database is unreachable") <= 1

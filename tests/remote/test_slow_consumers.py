"""Clients that hang up before reading the answer are charged the same way on every API (issue 40, finding 5).

The rule (README, "Limits and guarantees"): a request is charged for the tokens the backend generated
until the gateway noticed its client had gone; its row says ``cancelled``. The gateway reads at most 64
events ahead of what a streaming client has taken, so a client that stops reading holds its backend, and
one that then hangs up is not charged for an answer nobody read.

A fake vLLM streams 3,000 tokens (priced $0.001 an output token) in about 6 s; each client reads about
1 % of the stream (30 events) and hangs up: what had been generated when the gateway noticed is charged
(those 30, what the socket buffers and the 64 events ahead held), not the 3,000. A non-streamed
request whose reply takes 2 s is left after 0.3 s: nothing had arrived, nothing is charged.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
import sqlalchemy as sa

from fakes import start_server as start_fake
from fakes.behaviour import Behaviour
from tests.servers import wait_for

TOKENS = 3000
PRICE = {"input_per_mtok": 0.0, "output_per_mtok": 1000.0}
CHAT = [{"role": "user", "content": "tell me a long story"}]
CALLS = {
    "/v1/chat/completions": {"model": "priced", "messages": CHAT, "max_tokens": TOKENS},
    "/v1/completions": {"model": "priced", "prompt": "once upon a time", "max_tokens": TOKENS},
    "/v1/responses": {"model": "priced", "input": "tell me a long story", "max_output_tokens": TOKENS},
    "/api/chat": {"model": "priced", "messages": CHAT, "options": {"num_predict": TOKENS}},
    "/api/generate": {"model": "priced", "prompt": "once upon a time", "options": {"num_predict": TOKENS}},
    "/v1/messages": {"model": "priced", "messages": CHAT, "max_tokens": TOKENS},
}


@pytest.fixture(scope="module")
def fake():
    server = start_fake("vllm")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(fake, gateway_for):
    return gateway_for([{"name": "priced", "type": "vllm", "base_url": fake.url, "model": fake.behaviour.models[0],
                         "pricing": PRICE}])


def rows(server, agent: str) -> list[tuple]:
    db = sa.create_engine(server.db_url)
    try:
        with db.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(
                "SELECT route, stream, status, output_tokens, output_cost_usd FROM requests WHERE client = :c"),
                {"c": agent})]
    finally:
        db.dispose()


def read_a_little_and_hang_up(server, path: str, body: dict, agent: str) -> int:
    """Stream ``body``, read 30 events (lines), close the connection; the events read."""
    seen = 0
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", server.url + path, json={**body, "stream": True},
                           headers={"User-Agent": agent}) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                seen += line.startswith(("data:", "{"))
                if seen >= 30:
                    break
    return seen


def ask_and_hang_up(server, path: str, body: dict, agent: str) -> None:
    """Send ``body`` unstreamed on a raw socket and close it 0.3 s later, before any answer."""
    import json

    data = json.dumps({**body, "stream": False}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nUser-Agent: %s\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (path.encode(), agent.encode(), len(data), data))
        time.sleep(0.3)


@pytest.mark.parametrize("path", list(CALLS))
def test_a_streaming_client_that_reads_1_percent_and_hangs_up_is_cancelled_and_charged_what_was_generated(
        fake, server, path):
    agent = f"slow-stream{path.replace('/', '-')}"
    fake.behaviour.token_delay = 0.002  # 3,000 tokens take 6 s or more (a shorter sleep is no sleep at all)
    try:
        read_a_little_and_hang_up(server, path, CALLS[path], agent)
        assert wait_for(lambda: len(rows(server, agent)) == 1, timeout=20)
    finally:
        fake.behaviour.token_delay = 0.0
    (_, stream, status, tokens, cost), = rows(server, agent)
    assert stream and status == "cancelled", (status, tokens)
    # at least the tokens the client read: 30 events, of which up to 4 are framing (Anthropic's message_start,
    # content_block_start, ping; the role chunk elsewhere)
    assert 26 <= tokens < TOKENS // 2 and cost == pytest.approx(tokens * 0.001)


@pytest.mark.parametrize("path", list(CALLS))
def test_a_client_that_hangs_up_before_a_whole_reply_is_cancelled_on_every_api(fake, server, path):
    fake.behaviour.first_byte_delay = 2.0  # the reply takes 2 s to generate: the client leaves long before
    try:
        agent = f"gone{path.replace('/', '-')}"
        ask_and_hang_up(server, path, CALLS[path], agent)
        assert wait_for(lambda: len(rows(server, agent)) == 1, timeout=20)
    finally:
        fake.behaviour.first_byte_delay = 0.0
    (_, stream, status, tokens, cost), = rows(server, agent)
    assert not stream and status == "cancelled" and tokens < TOKENS and cost == pytest.approx(tokens * 0.001)

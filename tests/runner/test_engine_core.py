"""The native runner's engine core (``adapters/engines/runner/engine_core.py``), read from the gateway's end of
its socket: a real runner process over the tiny model, the messages as they arrive.

One engine step's outputs for every request it advanced come as one ``Outputs`` message; a ``Cancel`` ends a
request at once with a ``cancelled`` Done counting what it generated, and the engine runs nothing more for it;
a bad request fails alone and the runner goes on.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from adapters.engines.runner import protocol as p
from adapters.engines.runner.channel import BlockingChannel
from adapters.engines.runner.client import isolated, isolated_env
from core.base import GenerationRequest
from core.settings import LocalSettings

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.fixture(scope="module")
def runner(tiny_store):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    command = isolated("adapters.engines.runner", "--engine", "native", "--fd", str(theirs.fileno()),
                       "--parent", str(os.getpid()))
    proc = subprocess.Popen(command, env=isolated_env(os.environ), pass_fds=(theirs.fileno(),))
    theirs.close()
    channel = BlockingChannel(ours, p.from_runner)
    settings = LocalSettings(keep_alive=-1).model_dump()
    channel.send(p.Load("native", str(tiny_store.root), "tiny", {}, settings))
    ready = _next(channel)
    assert isinstance(ready, p.Ready) and ready.pid == proc.pid and ready.context_length > 0, ready
    try:
        yield channel
    finally:
        channel.send(p.Shutdown())
        assert proc.wait(timeout=30) == 0
        channel.close()


def _next(channel: BlockingChannel, timeout: float = 60.0) -> list:
    messages = channel.poll(timeout)
    assert messages, f"nothing from the runner in {timeout} s"
    return messages[0] if len(messages) == 1 else messages


def _read_until_finished(channel: BlockingChannel, ids: set[int]) -> tuple[list, dict[int, p.Finished]]:
    received, finished = [], {}
    while set(finished) != ids:
        for message in channel.poll(60.0):
            received.append(message)
            if isinstance(message, p.Outputs):
                finished.update((f.id, f) for f in message.finished)
            elif isinstance(message, p.Failed):
                raise AssertionError(p.error_from_wire(message.error))
    return received, finished


def _generate(id_: int, tokens: int, prompt: list[int] = PROMPT) -> p.Generate:
    request = GenerationRequest(model="tiny", prompt_tokens=prompt,
                                options={"temperature": 0, "num_predict": tokens, "ignore_eos": True})
    return p.Generate(id_, p.request_to_wire(request))


def test_one_step_of_two_requests_is_one_message(runner):
    runner.send(_generate(1, 6), _generate(2, 6))
    received, finished = _read_until_finished(runner, {1, 2})

    assert all(isinstance(m, p.Outputs) for m in received)  # no Token or Finished on its own
    both = [m for m in received if {t.id for t in m.tokens} == {1, 2}]
    assert both, "no step's outputs carried both requests"
    for id_ in (1, 2):
        ids = [t for m in received for token in m.tokens if token.id == id_ for t in token.chunk.token_ids]
        done = finished[id_].done
        assert done.finish_reason == "length" and done.usage.output_tokens == 6 == len(done.output_tokens)
        assert ids == done.output_tokens and done.prompt_tokens == PROMPT
    assert received[-1].load["requests_running"] == 0.0  # the load after the last step rides its message


def test_a_cancel_ends_the_request_at_once_and_a_bad_request_fails_alone(runner):
    runner.send(_generate(3, 400))
    first = _next(runner)
    assert isinstance(first, p.Outputs) and first.tokens[0].id == 3
    runner.send(p.Cancel(3), _generate(4, 2, prompt=[10**7]), p.Embed(5, "tiny", ["hi"]))
    received: list = []
    while len([m for m in received if isinstance(m, p.Failed)]) < 2 or not any(
            isinstance(m, p.Outputs) and m.finished for m in received):
        received += runner.poll(60.0)

    cancelled = next(f for m in received if isinstance(m, p.Outputs) for f in m.finished)
    assert cancelled.id == 3 and cancelled.done.finish_reason == "cancelled"
    assert 1 <= cancelled.done.usage.output_tokens < 400
    errors = {m.id: p.error_from_wire(m.error) for m in received if isinstance(m, p.Failed)}
    assert type(errors[4]).__name__ == "InvalidRequest" and "vocabulary" in errors[4].message
    assert type(errors[5]).__name__ == "InvalidRequest" and "embeddings" in errors[5].message
    runner.send(p.Ping(7))
    pong = next(m for m in _flatten(_next(runner)) if isinstance(m, p.Pong))
    assert pong.id == 7 and pong.load["requests_running"] == 0.0  # nothing runs for the cancelled request

    runner.send(_generate(6, 3))  # the runner goes on
    _, finished = _read_until_finished(runner, {6})
    assert finished[6].done.usage.output_tokens == 3


def _flatten(got) -> list:
    return got if isinstance(got, list) else [got]


def test_the_core_takes_what_the_gateway_resolved_and_reads_no_store(runner, tiny_store):
    """A ``Generate`` with ``resolved`` runs on those options and weights: the model's name is not looked up
    (one the store does not hold still runs), the request's own options are not re-read, and a request
    resolved to other weights than the runner's fails alone."""
    from adapters.engines.store_models import model_details
    from core.options import Options

    weights = model_details(tiny_store, "tiny").base_digest
    options = Options(temperature=0, num_predict=5, ignore_eos=True).model_dump()
    request = GenerationRequest(model="not-in-the-store", prompt_tokens=PROMPT, options={"num_predict": 2})
    runner.send(p.Generate(8, p.request_to_wire(request), resolved=p.Resolved(options, weights)))
    _, finished = _read_until_finished(runner, {8})
    assert finished[8].done.usage.output_tokens == 5

    runner.send(p.Generate(9, p.request_to_wire(request), resolved=p.Resolved(options, "sha256:other")))
    failed = _next(runner)
    assert isinstance(failed, p.Failed) and failed.id == 9
    assert "other weights" in p.error_from_wire(failed.error).message

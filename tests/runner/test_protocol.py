"""The runner protocol (adapters/engines/runner/protocol.py): every message survives the wire as the same type,
a request arrives as the same request less its cancel token and credential, and a runner's error
arrives as the same class of the error tree with its fields."""

from __future__ import annotations

import pytest

from core import errors
from core.base import Chunk, Done, EmbedResult, GenerationRequest, Timings, TokenLogprob, ToolCall, Usage
from adapters.engines.runner import protocol as p

DONE = Done("length", Usage(5, 3, cached_input_tokens=2), Timings(queue=0.1, ttft=0.2, token_times=[0.2, 0.3, 0.4]),
            prompt_tokens=[1, 2, 3, 4, 5], output_tokens=[6, 7, 8], truncated_messages=1)
CHUNK = Chunk("hé", [7], [TokenLogprob("h", -0.5, [104], [TokenLogprob("x", -2.0, [120])])],
              [ToolCall("get_weather", '{"city": "Paris"}', "call_1")])


@pytest.mark.parametrize("message", [
    p.Ready(123, 2048), p.Token(1, CHUNK), p.Finished(1, DONE), p.Embedded(2, EmbedResult([[0.5, 1.0]], 3, 0.1, 0.2)),
    p.Failed(3, p.WireError("QueueFull", "busy")), p.Pong(0, {"requests_running": 2.0})])
def test_runner_messages_round_trip(message):
    assert p.from_runner.decode(p.encoder.encode(message)) == message


@pytest.mark.parametrize("message", [
    p.Load("llamacpp", "/store", "tiny", {"num_ctx": 64}, {"keep_alive": 300.0}), p.Embed(4, "tiny", ["a", "b"]),
    p.Embed(5, "tiny", [[1, 2], [3]]), p.Cancel(1), p.Ping(9), p.Shutdown()])
def test_gateway_messages_round_trip(message):
    assert p.to_runner.decode(p.encoder.encode(message)) == message


def test_a_request_arrives_whole_without_its_cancel_token_caller_and_admission():
    async def admit(prompt_tokens, context, served_by=None):
        return 1

    request = GenerationRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], options={"num_ctx": 64},
                                tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required",
                                format={"type": "object"}, logprobs=True, top_logprobs=2, caller=object(),
                                key_name="team", admit=admit)
    message = p.to_runner.decode(p.encoder.encode(p.Generate(1, p.request_to_wire(request), admit=True)))
    wire = message.request
    assert "caller" not in wire and "admit" not in wire and "cancel" not in wire and message.admit
    back = p.request_from_wire(wire)
    assert (back.messages, back.options, back.tools, back.tool_choice, back.format, back.arrival) == (
        request.messages, request.options, request.tools, request.tool_choice, request.format, request.arrival)
    assert back.caller is None and back.admit is None and back.key_name == "team" and not back.cancel.cancelled


def test_a_request_keeps_its_keep_alive_in_the_gateway_whose_scheduler_stops_the_runner():
    for keep_alive in (0.0, 5.0, None):
        wire = p.to_runner.decode(p.encoder.encode(p.Generate(1, p.request_to_wire(
            GenerationRequest(model="tiny", prompt="hi", keep_alive=keep_alive))))).request
        assert wire["keep_alive"] == -1 and p.request_from_wire(wire).keep_alive == -1


def test_the_admission_round_trip_messages():
    asked = p.from_runner.decode(p.encoder.encode(p.Admit(3, 120, 512, "llamacpp")))
    assert (asked.id, asked.prompt_tokens, asked.context, asked.served_by) == (3, 120, 512, "llamacpp")
    assert p.to_runner.decode(p.encoder.encode(p.Admitted(3, 392))).cap == 392
    assert p.to_runner.decode(p.encoder.encode(p.Refused(3))).id == 3


@pytest.mark.parametrize("error", [
    errors.InvalidRequest("bad", param="format"), errors.ContextLengthExceeded(900, 512), errors.ModelNotFound("x"),
    errors.QueueFull("tiny"), errors.BackendUnavailable("down", partial=DONE),
    errors.BackendOverloaded("slow down", retry_after=2.0)])
def test_errors_keep_their_class_status_and_fields(error):
    wire = p.from_runner.decode(p.encoder.encode(p.Failed(1, p.error_to_wire(error)))).error
    back = p.error_from_wire(wire)
    assert type(back) is type(error) and back.status == error.status
    assert (back.message, back.param, back.partial) == (error.message, error.param, error.partial)
    assert getattr(back, "retry_after", None) == getattr(error, "retry_after", None)
    assert getattr(back, "num_ctx", None) == getattr(error, "num_ctx", None)


def test_an_unknown_error_class_is_a_plain_backend_error():
    back = p.error_from_wire(p.WireError("SomethingNew", "odd"))
    assert type(back) is errors.BackendError and back.message == "odd"


def test_messages_sent_together_arrive_in_order_from_one_write():
    """The runner sends a request's load report and its first token in one write (one wake-up of the gateway);
    the receiving end hands each message to its callback as its bytes arrive, whole, in order, and says
    when the other side closed."""
    import asyncio
    import socket

    from adapters.engines.runner.channel import Channel

    async def run() -> tuple[list, int]:
        ours, theirs = socket.socketpair()
        got, closed = [], asyncio.Event()
        sender = await Channel.open(ours, p.to_runner, lambda m: None)
        receiver = await Channel.open(theirs, p.from_runner, got.append, closed.set)
        writes = []
        write = sender._transport.write
        sender._transport.write = lambda data: writes.append(len(data)) or write(data)
        sender.send(p.Pong(0, {"requests_running": 1.0}), p.Token(7, CHUNK))
        sender.send(p.Finished(7, DONE))
        sender.close()
        await asyncio.wait_for(closed.wait(), 10)
        receiver.close()
        return got, len(writes)

    got, writes = asyncio.run(run())
    assert got == [p.Pong(0, {"requests_running": 1.0}), p.Token(7, CHUNK), p.Finished(7, DONE)] and writes == 2


def test_a_message_split_over_reads_arrives_once_whole_and_a_failing_handler_does_not_close_the_channel():
    """Bytes arrive as the socket gives them: a message cut anywhere is handed over once, whole; a handler that
    raises for one message leaves the channel reading the next."""
    import asyncio
    import socket

    from adapters.engines.runner.channel import Channel, frame

    async def run() -> list:
        ours, theirs = socket.socketpair()
        got = []

        def handle(message):
            if isinstance(message, p.Pong):
                raise RuntimeError("a handler's bug")
            got.append(message)

        receiver = await Channel.open(theirs, p.from_runner, handle)
        data = bytes(frame(p.encoder, (p.Token(7, CHUNK), p.Pong(1), p.Finished(7, DONE))))
        for i in range(0, len(data), 5):  # 5 bytes a write: every message split over several reads
            ours.send(data[i:i + 5])
            await asyncio.sleep(0.001)
        for _ in range(100):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        receiver.close()
        ours.close()
        return got

    assert asyncio.run(run()) == [p.Token(7, CHUNK), p.Finished(7, DONE)]

"""What a streamed response hands the server to write (``gateway/http/streaming.py``): the pieces that are
ready together leave in one write, a piece never waits for a later one, a write joins at most ``AHEAD``
pieces, and a response that ends early stops the read it was waiting on.

The response is called as uvicorn calls it (ASGI ``scope, receive, send``); ``send`` records each
``http.response.body`` message, which uvicorn turns into one ``transport.write``."""

from __future__ import annotations

import asyncio

from gateway.http.streaming import AHEAD, ndjson_response, sse_response


class Wire:
    """The ASGI side: the bodies sent, in order, and a client that never disconnects."""

    def __init__(self) -> None:
        self.bodies: list[tuple[bytes, bool]] = []
        self.silent = asyncio.get_running_loop().create_future()

    async def receive(self) -> dict:
        await self.silent
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.body":
            self.bodies.append((message["body"], message["more_body"]))


def sse(*numbers: int) -> bytes:
    return b"".join(b'data: {"n":%d}\n\n' % n for n in numbers)


async def serve(response) -> Wire:
    wire = Wire()
    await response({"type": "http"}, wire.receive, wire.send)
    return wire


def test_events_ready_together_leave_in_one_write():
    async def main() -> Wire:
        gate = asyncio.Event()

        async def objects():
            for n in range(5):  # arrived together: no wait between them
                yield {"n": n}
            await gate.wait()
            yield {"n": 5}
            yield {"n": 6}

        asyncio.get_running_loop().call_later(0.05, gate.set)
        return await serve(sse_response(objects()))

    wire = asyncio.run(main())
    assert wire.bodies == [(sse(0, 1, 2, 3, 4), True), (sse(5, 6) + b"data: [DONE]\n\n", False)]


def test_a_piece_is_written_before_the_next_read_waits():
    async def main() -> tuple[list, Wire]:
        gate = asyncio.Event()
        seen_before_gate: list = []
        wire = Wire()

        async def objects():
            yield {"n": 0}
            await gate.wait()
            yield {"n": 1}

        async def later() -> None:
            await asyncio.sleep(0.05)
            seen_before_gate.extend(wire.bodies)
            gate.set()

        task = asyncio.get_running_loop().create_task(later())
        await ndjson_response(objects())({"type": "http"}, wire.receive, wire.send)
        await task
        return seen_before_gate, wire

    seen_before_gate, wire = asyncio.run(main())
    assert seen_before_gate == [(b'{"n":0}\n', True)]
    assert wire.bodies == [(b'{"n":0}\n', True), (b'{"n":1}\n', False)]  # the last line carries the body's end


def test_a_write_joins_at_most_AHEAD_pieces():
    async def objects():
        for n in range(2 * AHEAD + 3):
            yield {"n": n}

    wire = asyncio.run(serve(sse_response(objects())))
    assert [body for body, _ in wire.bodies] == [sse(*range(AHEAD)), sse(*range(AHEAD, 2 * AHEAD)),
                                                  sse(*range(2 * AHEAD, 2 * AHEAD + 3)) + b"data: [DONE]\n\n"]
    assert [more for _, more in wire.bodies] == [True, True, False]


def test_a_response_that_ends_early_stops_the_read_it_was_waiting_on():
    """The server fails the write of the first piece while the next read waits: that read is cancelled where
    it waits (its ``finally`` runs at once), and the failure reaches the server."""
    async def main() -> tuple[list[str], BaseException | None]:
        gate = asyncio.Event()
        happened: list[str] = []

        async def objects():
            try:
                yield {"n": 0}
                await gate.wait()
                yield {"n": 1}
            except asyncio.CancelledError:
                happened.append("cancelled")
                raise
            finally:
                happened.append("closed")

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body":
                raise ConnectionResetError("the client's socket is gone")

        wire = Wire()
        failure = None
        try:
            await ndjson_response(objects())({"type": "http"}, wire.receive, send)
        except ConnectionResetError as exc:
            failure = exc
        return happened, failure

    happened, failure = asyncio.run(main())
    assert happened == ["cancelled", "closed"]
    assert isinstance(failure, ConnectionResetError)


def test_a_cancelled_response_cancels_the_read_where_it_waits():
    """The task writing the response is cancelled (shutdown) while its read waits: the source sees the
    cancellation at its own await, as if it were read directly, and the task ends cancelled."""
    async def main() -> tuple[list[str], bool]:
        happened: list[str] = []
        never = asyncio.get_running_loop().create_future()

        async def objects():
            yield {"n": 0}
            try:
                await never
            except asyncio.CancelledError:
                happened.append("cancelled at its await")
                raise

        wire = Wire()
        task = asyncio.get_running_loop().create_task(ndjson_response(objects())({"type": "http"}, wire.receive,
                                                                                 wire.send))
        await asyncio.sleep(0.02)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return happened + [wire.bodies[0][0].decode()], task.cancelled()

    happened, cancelled = asyncio.run(main())
    assert happened == ["cancelled at its await", '{"n":0}\n'] and cancelled


def test_a_timeout_inside_the_source_still_fires_while_it_waits():
    """A backend's deadline (``asyncio.timeout`` around its reads, as the remote adapters keep one) cancels the
    task that reads: it reaches the read where it waits and becomes the source's TimeoutError, which the
    framing turns into the error line."""
    async def main() -> Wire:
        async def objects():
            yield {"n": 0}
            try:
                async with asyncio.timeout(0.05):
                    await asyncio.get_running_loop().create_future()
            except TimeoutError:
                yield {"n": "timed out"}

        return await serve(ndjson_response(objects()))

    wire = asyncio.run(main())
    assert wire.bodies == [(b'{"n":0}\n', True), (b'{"n":"timed out"}\n', False)]

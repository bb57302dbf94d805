"""A pooled connection that the backend closed just as we reused it (issue 27): the request is sent
once more on a fresh connection instead of answering 502 (`Connection reset by peer`, `ClientOSError:
Can not write request body`, `ServerDisconnectedError`). A refused connection is not retried.

The backend here is a raw asyncio HTTP/1.1 server that answers the first request of each connection
with an OpenAI stream and keep-alive, then resets (RST) that connection when a second request
arrives on it: what a server whose keep-alive timer fired at that moment does."""

from __future__ import annotations

import asyncio
import socket
import struct

from core.base import Done, GenerationRequest
from core.errors import BackendUnavailable
from adapters.remote.base import RemoteSettings
from adapters.remote.registry import create_remote

SSE = (b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
       b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
       b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},'
       b'"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n'
       b"data: [DONE]\n\n")


class OneShotServer:
    def __init__(self):
        self.served = 0
        self.resets = 0
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = True
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            if not first:  # the keep-alive timer fired: reset, no answer
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.resets += 1
                writer.transport.abort()
                return
            first = False
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(SSE), SSE))
            await writer.drain()
            self.served += 1


async def ask(backend) -> list:
    request = GenerationRequest(model="pub", messages=[{"role": "user", "content": "hello"}],
                                options={"num_predict": 4})
    return [event async for event in backend.stream(request)]


def test_a_request_on_a_connection_the_backend_just_reset_is_sent_again_on_a_fresh_one():
    async def run():
        fake = OneShotServer()
        server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        backend = create_remote(RemoteSettings(name="pub", type="openai", base_url=f"http://127.0.0.1:{port}/v1",
                                               model="m"))
        try:
            answers = [await ask(backend) for _ in range(3)]
        finally:
            await backend.aclose()
            server.close()
        return fake, answers

    fake, answers = asyncio.run(run())
    for events in answers:
        assert events[0].text == "hi" and isinstance(events[-1], Done) and events[-1].usage.output_tokens == 1
    assert fake.resets >= 1 and fake.served == 3


def test_a_refused_connection_is_not_retried():
    from fakes.live import free_port

    async def run():
        backend = create_remote(RemoteSettings(name="pub", type="openai", base_url=f"http://127.0.0.1:{free_port()}/v1",
                                               model="m"))
        try:
            return await ask(backend)
        except BackendUnavailable as exc:
            return exc
        finally:
            await backend.aclose()

    error = asyncio.run(run())
    assert isinstance(error, BackendUnavailable) and "unreachable" in error.message

"""One runner's connection: a Unix socket pair, msgspec messages behind a 4-byte length prefix.

The gateway makes the pair and hands one end to the runner as an inherited file descriptor
(``--fd``): no path on disk, nothing to connect or clean up, and only the two processes can reach
it. Each message is ``len (4 bytes, big-endian) + MessagePack``, the framing msgspec documents for
streams; both sides read and write on their event loop's own thread, so a token crosses the
boundary with one ``write`` and one ``read``, and no other thread is woken on its way. The native
runner's engine core has no event loop: it reads and writes its end as a blocking socket
(:class:`BlockingChannel`) on the thread that steps the engine.
"""

from __future__ import annotations

import asyncio
import select
import socket
from typing import Any

import msgspec

_LEN = 4


def frame(encoder: msgspec.msgpack.Encoder, messages: tuple) -> bytearray:
    """``messages`` framed into one buffer (one write: the reader wakes once for them all)."""
    buffer = bytearray()
    for message in messages:
        start = len(buffer)
        buffer.extend(bytes(_LEN))
        encoder.encode_into(message, buffer, start + _LEN)
        buffer[start:start + _LEN] = (len(buffer) - start - _LEN).to_bytes(_LEN, "big")
    return buffer


class Channel:
    """``send`` never waits (the bytes go to the socket or the transport's buffer); ``recv`` returns the
    next message, and raises ``EOFError`` once the other side has closed or died."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, decoder: msgspec.msgpack.Decoder):
        self._reader, self._writer, self._decoder = reader, writer, decoder
        self._encoder = msgspec.msgpack.Encoder()

    @classmethod
    async def open(cls, sock: socket.socket, decoder: msgspec.msgpack.Decoder) -> "Channel":
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer, decoder)

    def send(self, *messages: Any) -> None:
        """Frame ``messages`` into one write (the reader wakes once for them all)."""
        self._writer.write(frame(self._encoder, messages))

    async def recv(self) -> Any:
        try:
            size = int.from_bytes(await self._reader.readexactly(_LEN), "big")
            return self._decoder.decode(await self._reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise EOFError("the other side of the runner channel is gone") from exc

    @property
    def closed(self) -> bool:
        return self._writer.is_closing()

    def close(self) -> None:
        self._writer.close()


class BlockingChannel:
    """The same framing on a blocking socket, for a thread with no event loop: ``send`` writes at once
    (waiting only while the gateway's socket buffer is full), ``poll`` returns the messages that have
    arrived, waiting up to ``timeout`` seconds for the first; ``EOFError`` once the gateway is gone."""

    def __init__(self, sock: socket.socket, decoder: msgspec.msgpack.Decoder):
        sock.setblocking(True)
        self._sock, self._decoder = sock, decoder
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer = bytearray()

    def send(self, *messages: Any) -> None:
        try:
            self._sock.sendall(frame(self._encoder, messages))
        except OSError as exc:
            raise EOFError("the gateway's side of the runner channel is gone") from exc

    def poll(self, timeout: float) -> list[Any]:
        if not self._complete() and select.select([self._sock], [], [], timeout)[0]:
            self._read()
        return self._messages()

    def _read(self) -> None:
        try:
            data = self._sock.recv(1 << 16)
        except OSError as exc:
            raise EOFError("the gateway's side of the runner channel is gone") from exc
        if not data:
            raise EOFError("the gateway closed the runner channel")
        self._buffer += data
        while select.select([self._sock], [], [], 0)[0]:  # the rest of what has arrived, without waiting
            more = self._sock.recv(1 << 16)
            if not more:
                break
            self._buffer += more

    def _complete(self) -> bool:
        return len(self._buffer) >= _LEN and len(self._buffer) >= _LEN + int.from_bytes(self._buffer[:_LEN], "big")

    def _messages(self) -> list[Any]:
        messages, view = [], memoryview(self._buffer)
        at = 0
        while len(view) - at >= _LEN:
            size = int.from_bytes(view[at:at + _LEN], "big")
            if len(view) - at - _LEN < size:
                break
            messages.append(self._decoder.decode(view[at + _LEN:at + _LEN + size]))
            at += _LEN + size
        view.release()
        del self._buffer[:at]
        return messages

    def close(self) -> None:
        self._sock.close()

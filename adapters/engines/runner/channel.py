"""One runner's connection: a Unix socket pair, msgspec messages behind a 4-byte length prefix.

The gateway makes the pair and hands one end to the runner as an inherited file descriptor
(``--fd``): no path on disk, nothing to connect or clean up, and only the two processes can reach
it. Each message is ``len (4 bytes, big-endian) + MessagePack``, the framing msgspec documents for
streams; both sides read and write on their event loop's own thread, so a token crosses the
boundary with one ``write`` and one ``read``, and no other thread is woken on its way.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import msgspec

_LEN = 4


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
        buffer = bytearray()
        for message in messages:
            start = len(buffer)
            buffer.extend(bytes(_LEN))
            self._encoder.encode_into(message, buffer, start + _LEN)
            buffer[start:start + _LEN] = (len(buffer) - start - _LEN).to_bytes(_LEN, "big")
        self._writer.write(buffer)

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

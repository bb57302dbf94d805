"""One runner's connection: a Unix socket pair, msgspec messages behind a 4-byte length prefix.

The gateway makes the pair and hands one end to the runner as an inherited file descriptor
(``--fd``): no path on disk, nothing to connect or clean up, and only the two processes can reach
it. Each message is ``len (4 bytes, big-endian) + MessagePack``, the framing msgspec documents for
streams; both sides read and write on their event loop's own thread, so a token crosses the
boundary with one ``write`` and one ``read``, and no other thread (nor task) is woken on its way. The native
runner's engine core has no event loop: it reads and writes its end as a blocking socket
(:class:`BlockingChannel`) on the thread that steps the engine.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
from collections.abc import Callable
from typing import Any

import msgspec

_LEN = 4
log = logging.getLogger(__name__)


def frame(encoder: msgspec.msgpack.Encoder, messages: tuple) -> bytearray:
    """``messages`` framed into one buffer (one write: the reader wakes once for them all)."""
    buffer = bytearray()
    for message in messages:
        start = len(buffer)
        buffer.extend(bytes(_LEN))
        encoder.encode_into(message, buffer, start + _LEN)
        buffer[start:start + _LEN] = (len(buffer) - start - _LEN).to_bytes(_LEN, "big")
    return buffer


class Channel(asyncio.Protocol):
    """An event loop's end. ``send`` never waits (the bytes go to the socket or the transport's buffer).
    Nothing reads: the loop's callback for the socket's bytes (``data_received``) decodes each whole message
    and hands it to ``on_message`` at once, so a runner's step reaches its requests' queues with no task in
    between (a reading task would be woken for it first); ``on_eof`` is called once the other side has
    closed or died. ``on_message`` must not raise: an error there is logged and the channel goes on."""

    def __init__(self, decoder: msgspec.msgpack.Decoder, on_message: Callable[[Any], None],
                 on_eof: Callable[[], None]):
        self._decoder, self._on_message, self._on_eof = decoder, on_message, on_eof
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    @classmethod
    async def open(cls, sock: socket.socket, decoder: msgspec.msgpack.Decoder, on_message: Callable[[Any], None],
                   on_eof: Callable[[], None] = lambda: None) -> "Channel":
        loop = asyncio.get_running_loop()
        _, channel = await loop.create_unix_connection(lambda: cls(decoder, on_message, on_eof), sock=sock)
        return channel

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            messages = split_frames(self._buffer, self._decoder)
        except msgspec.DecodeError:
            log.exception("a message on the runner channel could not be decoded; the channel closes")
            self._transport.close()
            return
        for message in messages:
            try:
                self._on_message(message)
            except Exception:  # noqa: BLE001 - one message's handler failing must not close the channel
                log.exception("handling %s from the runner channel failed", type(message).__name__)

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_eof()

    def send(self, *messages: Any) -> None:
        """Frame ``messages`` into one write (the reader wakes once for them all)."""
        self._transport.write(frame(self._encoder, messages))

    @property
    def closed(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def split_frames(buffer: bytearray, decoder: msgspec.msgpack.Decoder) -> list[Any]:
    """The whole messages at the start of ``buffer``, decoded and removed from it (a partial one stays)."""
    messages, view, at = [], memoryview(buffer), 0
    try:
        while len(view) - at >= _LEN:
            size = int.from_bytes(view[at:at + _LEN], "big")
            if len(view) - at - _LEN < size:
                break
            messages.append(decoder.decode(view[at + _LEN:at + _LEN + size]))
            at += _LEN + size
    finally:
        view.release()
        del buffer[:at]
    return messages


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
        return split_frames(self._buffer, self._decoder)

    def close(self) -> None:
        self._sock.close()

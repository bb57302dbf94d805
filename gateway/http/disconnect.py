"""Noticing a client that hung up on a non-streaming request, so its backend stops working for nobody.

Starlette cancels a streaming body when the client leaves, but a handler building one JSON answer
runs to the end. ``on_disconnect(receive, callback)`` watches the connection while the handler
waits: after the body has been read, the next ASGI message is ``http.disconnect``, and then
``callback`` runs (it cancels the generations; their rows say ``cancelled``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Receive = Callable[[], Awaitable[dict]]


@asynccontextmanager
async def on_disconnect(receive: Receive, callback: Callable[[], None]) -> AsyncIterator[None]:
    watcher = asyncio.get_running_loop().create_task(_wait_for_disconnect(receive))
    watcher.add_done_callback(lambda task: None if task.cancelled() or task.exception() else callback())
    try:
        yield
    finally:
        watcher.cancel()


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass

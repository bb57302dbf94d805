"""A local model in its runner: a process of ``infer serve`` (the gateway survives whatever happens in
inference), or a thread of ``infer run --local`` (the same code, no process).

    protocol.py     the typed messages (msgspec structs)
    channel.py      the connection: a Unix socket pair, length-prefixed messages
    client.py       the gateway's handle on one runner: start (a process, or a thread), load, stream, embed;
                    notices its death
    backend.py      ``RunnerBackend`` (the ``Backend`` protocol over runners), the scheduler's starter, and
                    the engines of ``infer serve`` and ``infer run --local``
    worker.py       the runner's body (``python -m adapters.engines.runner``): an event loop around a
                    llama.cpp or scripted engine
    engine_core.py  the native runner's body: the engine stepped on the thread that reads the socket

The scheduler that decides which runners run is ``adapters/engines/scheduler.py``.
"""

"""A local model in its own process: the gateway survives whatever happens in inference.

    protocol.py   the typed messages (msgspec structs)
    channel.py    the connection: an inherited Unix socket, length-prefixed messages
    client.py     the gateway's handle on one runner: start, load, stream, embed; notices its death
    backend.py    ``RunnerBackend`` (the ``Backend`` protocol over runners) and the scheduler's starter
    worker.py     the runner's loop around one in-process engine (``python -m adapters.engines.runner``)
    scripted.py   a model-less engine whose prompts can crash or hang it (tests, benches, fault drills)

The scheduler that decides which runners run is ``adapters/engines/scheduler.py``.
"""

"""Backends that are another server over HTTP. ``base.RemoteBackend`` holds what they share
(settings, the injected client, deadlines, the in-flight cap, usage accounting, error mapping);
each server type is one module that writes ``generate`` and registers itself by type name in
``registry`` (``create_remote(settings)``). ``direct``, ``wire``, ``http_errors`` and
``metrics_scrape`` are the HTTP plumbing: the aiohttp fast path, SSE/NDJSON parsing, failures ->
the error tree, Prometheus load signals.
"""

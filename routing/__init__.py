"""Routes with latency SLOs: pick a backend by predicted headroom, shed what cannot be served in
time, hedge a missing first token, retry and fall back, and measure attainment and goodput live.

    RouteEntry (config) ─► Route: strategy, predictor per backend, breaker per backend, stats
    Router.resolve(request) ─► RouteBackend.stream(request) ─► the chosen backend's events

Policies (``strategies``, ``predictor``, ``dispatch``, ``prefix``, ``breaker``) are plain objects
updated on the event loop without I/O; the only I/O is the backends' own streams, a health poller and,
for backends that publish their KV cache, a ZMQ subscriber per backend (``kv_events``).
"""

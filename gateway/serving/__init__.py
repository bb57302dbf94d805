"""The request path both APIs and ``infer run`` share: ``router.Router.resolve`` picks the backend,
once per request; ``recorder.Recorder`` runs the generation (waiting for its first event, so request
errors come before any response header) and writes its one ledger row.
"""

"""Model registry: names, the local store, the pull/push client and the registry server."""

__version__ = "0.1.0"

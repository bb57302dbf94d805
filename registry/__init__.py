"""Model registry: names, the local store, the pull/push client and the registry server."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("infer")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

"""The installed package's version, which ``/api/version`` reports and the CLI compares (no web stack
imported: the CLI reads it on every run)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("infer")
except PackageNotFoundError:  # running from a source tree that was not installed
    VERSION = "0.0.0"

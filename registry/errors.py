"""Errors raised by the registry package.

    RegistryError
    ├── InvalidName            a model name or digest that does not parse (raised before any I/O)
    ├── ModelNotFound          no such model or tag, locally or on the registry (404)
    ├── RegistryUnreachable    connection refused, DNS failure, TLS failure, timeout
    ├── RegistryHTTPError      any other unexpected status from a registry
    ├── AuthError              401/403 that the token flow could not satisfy
    ├── DigestMismatch         downloaded or uploaded bytes do not hash to their digest
    ├── DiskFull               ENOSPC while writing the store
    ├── ModelfileError         a Modelfile that does not parse or names missing files
    └── ModelFormatError       a blob that is not the format it claims (e.g. not GGUF)

Every message is one sentence a user can act on; the CLI prints it as is.
"""

from __future__ import annotations


class RegistryError(Exception):
    """Base class; ``str(err)`` is the user-facing sentence."""


class InvalidName(RegistryError, ValueError):
    pass


class ModelNotFound(RegistryError):
    pass


class RegistryUnreachable(RegistryError):
    pass


class RegistryHTTPError(RegistryError):
    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class AuthError(RegistryError):
    pass


class DigestMismatch(RegistryError):
    def __init__(self, want: str, got: str) -> None:
        super().__init__(
            f"digest mismatch, file must be downloaded again: want {want}, got {got}"
        )
        self.want = want
        self.got = got


class DiskFull(RegistryError):
    pass


class ModelfileError(RegistryError, ValueError):
    pass


class ModelFormatError(RegistryError):
    pass

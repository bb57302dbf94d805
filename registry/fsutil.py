"""Crash-safe file writes: temp file in the same directory, fsync, rename, fsync the directory."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import DiskFull


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def disk_errors(path: Path) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT into DiskFull with a sentence a user can act on."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(
                f"no space left on the device holding {path.parent}; free some space "
                "(e.g. 'infer rm' unused models) or point INFER_MODELS elsewhere"
            ) from exc
        raise


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with disk_errors(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    fsync_dir(path.parent)


def commit_file(tmp: Path, final: Path, mode: int = 0o644) -> None:
    """Move a fully written and fsynced temp file into place."""
    os.chmod(tmp, mode)
    os.replace(tmp, final)
    fsync_dir(final.parent)


@contextlib.contextmanager
def file_lock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """An advisory lock held for the block; yields False if non-blocking and already held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)

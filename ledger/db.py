"""The usage database: ``$INFER_HOME/usage.db`` (SQLite, WAL) or any SQLAlchemy URL
(``RegistrySettings.database_url`` in ``core/settings.py`` says which).

``infer serve`` and ``infer run`` write to the same file from different processes: WAL lets readers
run beside the one writer, and ``busy_timeout`` makes a second writer wait instead of failing.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from ledger.migrations import migrate

BUSY_TIMEOUT_S = 5.0


def open_db(url: str) -> Engine:
    """An engine on ``url`` with the schema migrated; ``ValueError`` for a URL that cannot be used."""
    parsed = _parse(url)
    try:
        engine = sa.create_engine(parsed)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise ValueError(f"invalid database URL {_shown(parsed)!r}: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        _prepare_sqlite(engine, parsed)
    migrate(engine)
    return engine


def _parse(url: str) -> URL:
    try:
        return make_url(url)
    except ArgumentError:
        raise ValueError(f"invalid database URL {url!r}: expected e.g. sqlite:///path/usage.db") from None


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _prepare_sqlite(engine: Engine, url: URL) -> None:
    if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    event.listen(engine, "connect", _on_sqlite_connect)
    event.listen(engine, "begin", _on_sqlite_begin)


def _on_sqlite_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (_on_sqlite_begin)
    dbapi_conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    _enable_wal(dbapi_conn)
    dbapi_conn.execute("PRAGMA synchronous=NORMAL")


def _enable_wal(dbapi_conn: sqlite3.Connection) -> None:
    """Switch a fresh file to WAL (it stays so). That switch ignores busy_timeout, so retry it here."""
    if dbapi_conn.execute("PRAGMA journal_mode").fetchone()[0] in ("wal", "memory"):
        return
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _on_sqlite_begin(conn: sa.Connection) -> None:
    immediate = conn.get_execution_options().get("infer_begin_immediate")
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

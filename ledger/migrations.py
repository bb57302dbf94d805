"""Numbered schema migrations, applied once each and recorded in ``_infer_migrations``.

Each migration is a function of a SQLAlchemy ``Connection`` that runs inside its own transaction,
written against the schema as it was at that point (never against the SQLModel classes, which move
on). To change the schema, append ``m00N_what`` to ``MIGRATIONS``; never edit an applied one.

On SQLite, ``ledger.db.open_db`` turns the ``infer_begin_immediate`` execution option into
``BEGIN IMMEDIATE``, so two processes opening a fresh file at once apply each migration once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from ledger.tables import utc_iso

Migration = Callable[[Connection], None]

_migrations = sa.Table(
    "_infer_migrations", sa.MetaData(),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("applied_at", sa.String(32), nullable=False),
)


def m001_requests(conn: Connection) -> None:
    """The usage ledger: one row per served request."""
    metadata = sa.MetaData()
    sa.Table(
        "requests", metadata,
        sa.Column("id", sa.String(26), primary_key=True),
        sa.Column("datetime_utc", sa.String(32), nullable=False, index=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("client", sa.Text),
        sa.Column("route", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False, index=True),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("stream", sa.Boolean, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("finish_reason", sa.String(32)),
        sa.Column("input_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.Column("cached_input_tokens", sa.Integer),
        *(sa.Column(name, sa.Float) for name in ("queue_ms", "ttft_ms", "tpot_ms", "total_ms")),
        sa.Column("error", sa.Text),
    )
    metadata.create_all(conn)


def m002_usage_source(conn: Connection) -> None:
    """Who counted a row's tokens: ``engine``, ``backend`` or ``estimated`` (NULL for older rows)."""
    conn.execute(sa.text("ALTER TABLE requests ADD COLUMN usage_source VARCHAR(16)"))


def m003_routes(conn: Connection) -> None:
    """Routes with SLOs: the route a request named, the attempts it took, whether it met its SLO
    (NULL without one) and the parts it missed (``ttft,tpot,e2e``); shed requests have status ``shed``."""
    for column in ("route_name VARCHAR(255)", "attempts INTEGER", "slo_met BOOLEAN", "slo_missed VARCHAR(32)"):
        conn.execute(sa.text(f"ALTER TABLE requests ADD COLUMN {column}"))


def m004_costs(conn: Connection) -> None:
    """What each request cost, split by token kind, and the pricing entry it was costed with."""
    for column in ("input_cost_usd FLOAT", "cached_input_cost_usd FLOAT", "output_cost_usd FLOAT",
                   "total_cost_usd FLOAT", "pricing_version VARCHAR(32)"):
        conn.execute(sa.text(f"ALTER TABLE requests ADD COLUMN {column}"))


def m005_api_keys(conn: Connection) -> None:
    """API keys (hash only), their budgets (spent and reserved per period) and limits; the key
    a request used."""
    metadata = sa.MetaData()
    sa.Table(
        "api_keys", metadata,
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float),
        sa.Column("budget_usd", sa.Float),
        sa.Column("period_s", sa.Float),
        sa.Column("period_start", sa.Float, nullable=False),
        sa.Column("spent_usd", sa.Float, nullable=False),
        sa.Column("reserved_usd", sa.Float, nullable=False),
        sa.Column("rpm", sa.Integer),
        sa.Column("tpm", sa.Integer),
        sa.Column("routes", sa.Text),
    )
    metadata.create_all(conn)
    conn.execute(sa.text("ALTER TABLE requests ADD COLUMN key_name VARCHAR(255)"))


def m006_expected_cached(conn: Connection) -> None:
    """The prompt tokens a route's prefix index expected the backend to hold in its KV cache (NULL: no
    index: not a ``prefix`` or ``slo`` route); ``cached_input_tokens`` is what the backend reported."""
    conn.execute(sa.text("ALTER TABLE requests ADD COLUMN expected_cached_tokens INTEGER"))


def m007_reasoning(conn: Connection) -> None:
    """Thinking: how many of a row's output tokens were reasoning, and what they cost (part of the output cost)."""
    for column in ("reasoning_tokens INTEGER", "reasoning_cost_usd FLOAT"):
        conn.execute(sa.text(f"ALTER TABLE requests ADD COLUMN {column}"))


def m008_responses(conn: Connection) -> None:
    """The Responses API's stored responses (``previous_response_id``): the response object and the
    conversation it ends, kept until ``expires_at`` (epoch seconds)."""
    metadata = sa.MetaData()
    sa.Table(
        "responses", metadata,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False, index=True),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("conversation", sa.Text, nullable=False),
    )
    metadata.create_all(conn)


def m009_key_roles_and_holds(conn: Connection) -> None:
    """A key's role (``caller`` or ``operator``; NULL reads as caller) and output cap; budget holds as
    rows that expire (``key_holds``), so a hold whose request never settled cannot stay forever.
    Reservations made before this migration had no rows: they are released."""
    for column in ("role VARCHAR(16)", "max_output_tokens INTEGER"):
        conn.execute(sa.text(f"ALTER TABLE api_keys ADD COLUMN {column}"))
    conn.execute(sa.text("UPDATE api_keys SET reserved_usd = 0.0"))
    metadata = sa.MetaData()
    sa.Table(
        "key_holds", metadata,
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("key_name", sa.String(255), nullable=False),
        sa.Column("amount_usd", sa.Float, nullable=False),
        sa.Column("period_start", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Index("ix_key_holds_key_expires", "key_name", "expires_at"),
    )
    metadata.create_all(conn)


def m010_response_owners(conn: Connection) -> None:
    """The ledger key that stored a response (NULL: none); a caller's key reads and deletes only its own."""
    conn.execute(sa.text("ALTER TABLE responses ADD COLUMN key_name VARCHAR(255)"))


def m011_disagg(conn: Connection) -> None:
    """Prefill/decode disaggregation: the worker that prefilled (``backend`` decoded), the prefill leg's
    time, and the cost split by leg (NULL: served co-located)."""
    for column in ("prefill_backend VARCHAR(255)", "prefill_ms FLOAT", "prefill_cost_usd FLOAT",
                   "decode_cost_usd FLOAT"):
        conn.execute(sa.text(f"ALTER TABLE requests ADD COLUMN {column}"))


def m012_backend_reported_output(conn: Connection) -> None:
    """The output a backend reported beyond the cap the gateway enforced (NULL: it kept to it)."""
    conn.execute(sa.text("ALTER TABLE requests ADD COLUMN backend_reported_output_tokens INTEGER"))


MIGRATIONS: list[Migration] = [m001_requests, m002_usage_source, m003_routes, m004_costs, m005_api_keys,
                               m006_expected_cached, m007_reasoning, m008_responses, m009_key_roles_and_holds,
                               m010_response_owners, m011_disagg, m012_backend_reported_output]


def migrate(engine: Engine) -> list[str]:
    """Apply the pending migrations in order; return the names applied (``[]`` when up to date)."""
    with engine.connect() as conn:
        if not {m.__name__ for m in MIGRATIONS} - applied_migrations(conn):
            return []
    applied = []
    with engine.connect() as conn:
        conn.execution_options(infer_begin_immediate=True)
        for migration in MIGRATIONS:
            with conn.begin():
                _migrations.create(conn, checkfirst=True)
                if migration.__name__ in applied_migrations(conn):
                    continue
                migration(conn)
                conn.execute(_migrations.insert().values(
                    name=migration.__name__, applied_at=utc_iso(datetime.now(timezone.utc))))
            applied.append(migration.__name__)
    return applied


def applied_migrations(conn: Connection) -> set[str]:
    if not sa.inspect(conn).has_table(_migrations.name):
        return set()
    return set(conn.scalars(sa.select(_migrations.c.name)))

"""The Responses API's stored responses (``POST /v1/responses`` with ``store``), for ``previous_response_id``.

One row per stored response in the ``responses`` table of the ledger database (migration
``m008_responses``): the response object as the client saw it (``GET /v1/responses/{id}``), the
conversation it ends in the gateway's internal message shape (what the next turn continues), and
``expires_at``: rows past it are neither read nor kept (``prune`` deletes them, at most once a minute
from ``save``). A row keeps the ledger key that stored it (``key_name``, migration
``m010_response_owners``): ``load`` and ``delete`` with an ``owner`` see only that key's rows (a
caller's key), without one every row (an operator, or a server without auth). Synchronous
(SQLAlchemy Core): the gateway calls these in a worker thread.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

PRUNE_EVERY_S = 60.0

_T = sa.Table(
    "responses", sa.MetaData(),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("model", sa.String(255), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("conversation", sa.Text, nullable=False),
    sa.Column("key_name", sa.String(255)),
)
_pruned = {"at": 0.0}
_lock = threading.Lock()


@dataclass(frozen=True)
class StoredResponse:
    id: str
    body: dict[str, Any]
    conversation: list[dict[str, Any]]


def save(db: Engine, body: dict[str, Any], conversation: list[dict[str, Any]], retention_s: float,
         now: float | None = None, key_name: str | None = None) -> None:
    now = time.time() if now is None else now
    row = {"id": body["id"], "created_at": now, "expires_at": now + retention_s, "model": body["model"],
           "body": json.dumps(body, ensure_ascii=False), "conversation": json.dumps(conversation, ensure_ascii=False),
           "key_name": key_name}
    with db.begin() as conn:
        conn.execute(_T.insert(), row)
    with _lock:
        due = now - _pruned["at"] >= PRUNE_EVERY_S
        if due:
            _pruned["at"] = now
    if due:
        prune(db, now)


def load(db: Engine, response_id: str, now: float | None = None, owner: str | None = None) -> StoredResponse | None:
    """The stored response, or None when it was never stored, was deleted, has expired or is not
    ``owner``'s (when one is given)."""
    now = time.time() if now is None else now
    query = sa.select(_T.c.body, _T.c.conversation).where(_T.c.id == response_id, _T.c.expires_at > now,
                                                         *_owned(owner))
    with db.connect() as conn:
        row = conn.execute(query).first()
    if row is None:
        return None
    return StoredResponse(response_id, json.loads(row.body), json.loads(row.conversation))


def delete(db: Engine, response_id: str, owner: str | None = None) -> bool:
    with db.begin() as conn:
        return conn.execute(_T.delete().where(_T.c.id == response_id, *_owned(owner))).rowcount > 0


def _owned(owner: str | None) -> list:
    return [] if owner is None else [_T.c.key_name == owner]


def prune(db: Engine, now: float | None = None) -> int:
    """Delete the expired rows; how many went."""
    now = time.time() if now is None else now
    with db.begin() as conn:
        return conn.execute(_T.delete().where(_T.c.expires_at <= now)).rowcount

"""The Responses store: saved rows are read back until their retention ends, then neither read nor kept."""

from __future__ import annotations

import pytest

from ledger import responses as store
from ledger.db import open_db


@pytest.fixture
def db(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'usage.db'}")
    yield engine
    engine.dispose()


def test_retention(db):
    body = {"id": "resp_1", "model": "m", "output": []}
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    store.save(db, body, conversation, retention_s=60, now=1000.0)
    found = store.load(db, "resp_1", now=1059.0)
    assert (found.body, found.conversation) == (body, conversation)
    assert store.load(db, "resp_1", now=1060.0) is None
    assert store.prune(db, now=1059.0) == 0 and store.prune(db, now=1061.0) == 1
    assert store.load(db, "resp_1", now=1000.0) is None and not store.delete(db, "resp_1")

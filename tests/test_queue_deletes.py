"""The work queues' finished rows leave by their keys (projections.search.claims.delete_claimed): exactly those rows,
each row's tenant returned once for the counters, a key no longer queued deleting nothing. On the real PostgreSQL,
in a private schema, for both queues (the indexers' outbox and the embedders' queue).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from producers.settings import Settings
from projections.postgres.schema import create_schema, drop_schema
from projections.search.claims import DELETE_CLAIMED, delete_claimed
from tests.support.stores import pg

# each queue's rows as its writers insert them, and the key its finished rows are deleted by
FILL = {
    "search_outbox": "INSERT INTO search_outbox (version_id, tenant, subject, op, priority) "
    "SELECT 'v' || g, 't' || (g % 3), 's', 'upsert', g % 2 FROM generate_series(1, %s) g",
    "embed_queue": "INSERT INTO embed_queue (version_id, tenant, since) "
    "SELECT 'v' || g, 't' || (g % 3), now() FROM generate_series(1, %s) g",
}
KEY = {"search_outbox": "id", "embed_queue": "version_id"}


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    c = pg(settings)
    try:
        yield c
    finally:
        c.close()
        with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
            drop_schema(admin, settings.pg_schema)


@pytest.mark.parametrize("queue", sorted(DELETE_CLAIMED))
def test_delete_claimed_removes_exactly_the_given_rows(conn: psycopg.Connection, queue: str) -> None:
    conn.execute(FILL[queue].replace("%s", "30"))
    rows = conn.execute(f"SELECT {KEY[queue]}, tenant FROM {queue} ORDER BY id").fetchall()
    chosen = rows[3:12]
    absent = [10**9] if queue == "search_outbox" else ["v-never-queued"]
    twice = [chosen[0][0]]  # a key given twice deletes its row once: the counters move once
    gone = delete_claimed(conn, queue, [k for k, _ in chosen] + absent + twice)
    assert sorted(gone) == sorted(t for _, t in chosen)  # each row's tenant once; a key not queued deletes nothing
    left = conn.execute(f"SELECT {KEY[queue]} FROM {queue} ORDER BY id").fetchall()
    assert [k for (k,) in left] == [k for k, _ in rows[:3] + rows[12:]]
    assert delete_claimed(conn, queue, []) == []

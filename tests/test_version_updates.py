"""Which updates of a stored version stay on its page (HOT: no index entry written), on the real PostgreSQL.

A chain renumbered by a late version, a confirmation counted and a new document revision change no column an
index of `fact_versions` reads, so PostgreSQL updates such a row in place; a supersession or a retraction changes
what the partial indexes read and is written as a new row version with its index entries. Counted within one
transaction by `pg_stat_get_xact_tuples_hot_updated`.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from producers.settings import Settings
from projections.postgres.recorder import VERSION_COLUMNS, version_to_row
from projections.versions import additions, plan
from tests.support.events import asserted
from tests.support.stores import private_schema


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection]:
    with private_schema(settings) as c:
        yield c


def _stored_chain(conn: psycopg.Connection) -> list[str]:
    """A fact with two versions (the first superseded), written as the recorder's rows; their version ids."""
    events = [asserted("user:1", "seat", "window", 0), asserted("user:1", "seat", "aisle", 1)]
    added = additions((e, 0, i) for i, e in enumerate(events))
    (mid,) = added.facts
    rows = plan([], [], added.versions[mid]).inserts
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in VERSION_COLUMNS)
    marks = sql.SQL(", ").join(sql.Placeholder() * len(VERSION_COLUMNS))
    conn.cursor().executemany(
        sql.SQL("INSERT INTO fact_versions ({}) VALUES ({})").format(cols, marks), [version_to_row(v) for v in rows]
    )
    return [v.version_id for v in sorted(rows, key=lambda v: v.version)]


def _hot_updates(conn: psycopg.Connection, update: str, version_id: str) -> tuple[int, int]:
    """(updated, of them in place) by `update` of one row, in a transaction rolled back after."""
    with conn.transaction() as tx:
        conn.execute(update + " WHERE version_id = %s", (version_id,))
        row = conn.execute(
            "SELECT pg_stat_get_xact_tuples_updated('fact_versions'::regclass), "
            "pg_stat_get_xact_tuples_hot_updated('fact_versions'::regclass)"
        ).fetchone()
        raise psycopg.Rollback(tx)
    return row  # type: ignore[return-value]  # set before the rollback


@pytest.mark.parametrize(
    "update",
    [
        "UPDATE fact_versions SET version = version + 1",  # a late version renumbers the chain after it
        "UPDATE fact_versions SET confirmed_count = confirmed_count + 1, last_confirmed_at = now()",
        "UPDATE fact_versions SET rev = nextval('doc_rev')",  # an embedder's new vectors: a new document revision
    ],
)
def test_an_update_no_index_reads_stays_on_its_page(conn: psycopg.Connection, update: str) -> None:
    _, current = _stored_chain(conn)
    assert _hot_updates(conn, update, current) == (1, 1)


def test_a_supersession_is_written_with_its_index_entries(conn: psycopg.Connection) -> None:
    """The counter tells the two apart: a change the partial indexes read is not in place."""
    _, current = _stored_chain(conn)
    update = "UPDATE fact_versions SET status = 'retracted', valid_to = valid_from + interval '1 day'"
    assert _hot_updates(conn, update, current) == (1, 0)


def test_the_versions_table_keeps_room_on_each_page(conn: psycopg.Connection) -> None:
    options = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'fact_versions'::regclass").fetchone()[0]
    assert "fillfactor=90" in options

"""The work queues (the indexers' outbox, the embedders' queue) on the real PostgreSQL, in a private schema.

- A batch's finished rows leave by their keys (projections.search.claims.delete_claimed): exactly those rows, each
  row's tenant returned once for the counters, a key no longer queued deleting nothing.
- A queue's size swings from a few rows to thousands between two batches, and a plan PostgreSQL cached while it
  was small keeps scanning it whole once it has grown; the drain loop's connection therefore prepares no statement
  (each is planned at its call, on the table as it is then), and the API's reads of the queues (read-your-writes
  waits, /v1/stats) are planned at each call on its connections, which otherwise keep generic plans.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from producers.settings import Settings
from projections.postgres.connection import configure_pool
from projections.postgres.positions import search_pending_async
from projections.postgres.stats import stats_counts
from projections.search import claims
from projections.search.claims import DELETE_CLAIMED, claim_fairly, delete_claimed
from projections.search.drain import drain_forever
from projections.search.indexer import CLAIMED_COLUMNS, FIRST_WRITES
from tests.support.stores import private_schema

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
    with private_schema(settings) as c:
        yield c


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


def _plan(conn: psycopg.Connection, statement: str) -> str:
    return "\n".join(r for (r,) in conn.execute(f"EXPLAIN {statement}"))


def test_a_plan_cached_while_the_queue_was_small_scans_it_whole_once_it_has_grown(conn: psycopg.Connection) -> None:
    """Why the drain loop prepares nothing: PostgreSQL's own behaviour, which these statements must not meet."""
    conn.execute(FILL["search_outbox"].replace("%s", "5"))
    conn.execute("ANALYZE search_outbox")
    conn.execute(f"PREPARE finished(bigint[]) AS {DELETE_CLAIMED['search_outbox'].replace('%s', '$1')}")
    for _ in range(6):  # after five custom plans PostgreSQL keeps the generic one, made on five rows
        _plan(conn, "EXECUTE finished('{1,2,3}')")
    # a backlog, mostly drained since: the table's pages hold it, its statistics still say five rows
    conn.execute(FILL["search_outbox"].replace("%s", "100000"))
    conn.execute("DELETE FROM search_outbox WHERE id <= 95000")
    newest = conn.execute("SELECT id FROM search_outbox ORDER BY id DESC LIMIT 300").fetchall()
    keys = "{" + ",".join(str(k) for (k,) in newest) + "}"
    cached = _plan(conn, f"EXECUTE finished('{keys}')")
    planned_now = _plan(conn, DELETE_CLAIMED["search_outbox"].replace("%s", f"'{keys}'::bigint[]"))
    assert "Seq Scan on search_outbox" in cached, cached
    assert "search_outbox_pkey" in planned_now and "Seq Scan" not in planned_now, planned_now


def test_the_drain_loops_connection_prepares_no_statement(settings: Settings, conn: psycopg.Connection) -> None:
    conn.execute(FILL["search_outbox"].replace("%s", "200"))
    conn.execute(FILL["embed_queue"].replace("%s", "200"))
    prepared: list[int] = []

    def once(loop_conn: psycopg.Connection) -> bool:
        for _ in range(8):  # a connection that prepares does it at a statement's fifth call (psycopg's default)
            with loop_conn.transaction():
                claimed = claim_fairly(loop_conn, "search_outbox", CLAIMED_COLUMNS, 10, FIRST_WRITES)
                delete_claimed(loop_conn, "search_outbox", [row[0] for row in claimed])
                versions = [v for (v,) in loop_conn.execute("SELECT version_id FROM embed_queue ORDER BY id LIMIT 10")]
                delete_claimed(loop_conn, "embed_queue", versions)
        prepared.append(loop_conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0])
        return False

    drain_forever(
        settings,
        once,
        channels=(),
        poll_seconds=0,
        log=logging.getLogger("test"),
        record_error=lambda store: pytest.fail(f"a round failed ({store})"),
        stop=lambda: bool(prepared),
    )
    assert prepared == [0]
    assert conn.execute("SELECT count(*) FROM search_outbox").fetchone()[0] == 200 - 80  # the rounds did their work


def test_the_apis_reads_of_a_queue_are_planned_at_each_call(settings: Settings, conn: psycopg.Connection) -> None:
    conn.execute(FILL["search_outbox"].replace("%s", "50"))
    conn.execute(FILL["embed_queue"].replace("%s", "50"))

    async def ask() -> list[str]:
        pool = AsyncConnectionPool(  # the API's pool: its connections keep the generic plan of what they prepare
            settings.pg_dsn,
            min_size=1,
            max_size=1,
            configure=configure_pool(settings.pg_schema, generic_plans=True),
            open=False,
            kwargs={"autocommit": True},
        )
        await pool.open()
        try:
            async with pool.connection() as c:
                for _ in range(8):  # psycopg prepares a statement at its fifth call
                    assert await search_pending_async(c, "documents", "t1", {0: 10**9})
                    assert await search_pending_async(c, "vectors", "t1", {0: 10**9})
                    lag = (await stats_counts(c, "t1", settings.topic))["search_lag"]
                    assert lag["documents_lag_s"] is not None and lag["vectors_lag_s"] is not None  # the oldest rows
                cur = await c.execute("SELECT statement FROM pg_prepared_statements")
                return [r[0] for r in await cur.fetchall()]
        finally:
            await pool.close()

    prepared = asyncio.run(ask())
    assert not [q for q in prepared if "search_outbox" in q or "embed_queue" in q], prepared


# each queue's claim as its stage makes it: the rows it admits, and the index its walk of the tenants must use
CLAIMS = {
    "search_outbox": (CLAIMED_COLUMNS, FIRST_WRITES, "search_outbox_first"),
    "embed_queue": ("id, version_id, tenant", "TRUE", "embed_queue_tenant"),
}


@pytest.mark.parametrize("queue", sorted(CLAIMS))
def test_a_claim_shares_its_batch_among_the_tenants_waiting(conn: psycopg.Connection, queue: str) -> None:
    """A tenant's backlog, then another tenant's one new row: a batch of 4 holds that row beside the backlog's
    oldest (the longest waiting tenant's share first), and each tenant's rows oldest first; the outbox's claim
    takes no vector rewrite (priority 1) while new documents wait. The walk of the tenants is by the queue's index,
    not a scan of the queue, however long it is."""
    columns, only, index = CLAIMS[queue]
    conn.execute(FILL[queue].replace("%s", "20000").replace("'t' || (g % 3)", "'busy'"))
    one_new = FILL[queue].replace("%s", "1").replace("g % 2", "0")  # a new document's row, not a rewrite
    conn.execute(one_new.replace("'v' || g", "'v-quiet'").replace("'t' || (g % 3)", "'quiet'"))
    conn.execute(f"ANALYZE {queue}")
    admitted = f"SELECT id, tenant FROM {queue} WHERE {only} ORDER BY id"
    busy = [i for i, t in conn.execute(admitted).fetchall() if t == "busy"]
    quiet = conn.execute(f"SELECT id FROM {queue} WHERE tenant = 'quiet'").fetchone()[0]
    with conn.transaction():
        batch = claim_fairly(conn, queue, columns, 4, only)
        raise psycopg.Rollback()
    assert [row[0] for row in batch] == [*busy[:3], quiet], batch  # shares 2 + 2, the quiet one's unused one to busy
    with conn.transaction():
        assert [row[0] for row in claim_fairly(conn, queue, columns, 1, only)] == [busy[0]]  # the longest waiting
        raise psycopg.Rollback()
    walk = sql.SQL(claims._WAITING).format(queue=sql.Identifier(queue), only=sql.SQL(only), columns=sql.SQL(columns))
    plan = "\n".join(r for (r,) in conn.execute(sql.SQL("EXPLAIN ") + walk, (4,)))
    assert index in plan and "Seq Scan" not in plan, plan


def test_a_write_is_pending_in_a_stage_by_its_own_places_only(settings: Settings, conn: psycopg.Connection) -> None:
    """What a read with a token waits for (api.consistency): a row of the tenant queued for a record below the
    token's positions, in that stage's queues (documents: the outbox's first writes; vectors: every row of the
    outbox and the embedders' queue), never a later record's row, another partition's or another tenant's; a row
    queued before rows had places is below every token."""
    conn.execute(
        'INSERT INTO search_outbox (version_id, tenant, subject, op, priority, "partition", "offset") VALUES '
        "('a', 't1', 's', 'upsert', 0, 0, 10), ('b', 't1', 's', 'upsert', 0, 0, 20), "
        "('c', 't1', 's', 'upsert', 1, 1, 5), ('d', 't2', 's', 'upsert', 0, 3, 1)"
    )
    conn.execute("INSERT INTO embed_queue (version_id, tenant, since, \"partition\", \"offset\") "
                 "VALUES ('e', 't1', now(), 2, 7)")  # fmt: skip

    def pending(stage: str, tenant: str, below: dict[int, int]) -> bool:
        async def ask() -> bool:
            async with await psycopg.AsyncConnection.connect(settings.pg_dsn, autocommit=True) as c:
                await c.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(settings.pg_schema)))
                return await search_pending_async(c, stage, tenant, below)

        return asyncio.run(ask())

    assert not pending("documents", "t1", {0: 10})  # its first row is at offset 10: the token is before it
    assert pending("documents", "t1", {0: 11}) and pending("documents", "t1", {0: 99, 5: 1})
    assert not pending("documents", "t1", {1: 99, 2: 99, 3: 99})  # a vector rewrite, a vector queued, t2's row
    assert pending("vectors", "t1", {1: 6}) and pending("vectors", "t1", {2: 8})
    assert not pending("vectors", "t1", {1: 5, 2: 7, 3: 99, 4: 99})
    assert not pending("documents", "t2", {0: 99}) and pending("documents", "t2", {3: 2})
    conn.execute("INSERT INTO search_outbox (version_id, tenant, subject, op) VALUES ('f', 't2', 's', 'upsert')")
    assert pending("documents", "t2", {5: 1}) and pending("vectors", "t2", {5: 1}) and not pending("vectors", "t3", {})

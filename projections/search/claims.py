"""The locks that let any number of indexers and embedders share one schema's work.

- Work is claimed row by row: `FOR UPDATE SKIP LOCKED` on search_outbox (indexers) and embed_queue (embedders),
  inside the transaction that finishes it, so a process killed mid-batch releases its rows with its connection
  and another takes them; two never hold the same row. `claim_fairly` shares a batch among the tenants waiting,
  so one tenant's backlog holds another's new row back by one batch, not by the backlog.
- `finish`: each batch ends under one transaction-level advisory lock per schema (`pg_advisory_xact_lock`), held
  for the few statements that delete the claimed rows, adjust the shared counters (shard -1) and append to
  vocab_log. So counter rows are never locked in two orders (no deadlock), and vocab_log's sequence numbers are
  drawn in commit order, which the API's vocabulary watermark needs (projections.search.vocab).
- `delete_claimed`: a batch's finished rows leave their queue by their keys, in one statement for both queues; the
  drain loop's connection plans it at each call (projections.search.drain), as a queue's size swings.
- `writing`: an indexer writes to the index under the reindex lock in shared mode (`pg_try_advisory_xact_lock_
  shared`); `ledger reindex` takes it exclusively, so no batch lands in the old index after the reindex read
  its rows; the indexers' batches wait (skip) until the alias has switched.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from producers.settings import Settings

__all__ = [
    "DELETE_CLAIMED",
    "claim_fairly",
    "delete_claimed",
    "finish",
    "reindex_key",
    "release_reindex",
    "take_reindex",
    "writing",
]

# per queue: its finished rows by their unique key, each row's tenant returned (the counters' deltas)
DELETE_CLAIMED = {
    "search_outbox": "DELETE FROM search_outbox WHERE id = ANY(%s) RETURNING tenant",
    "embed_queue": "DELETE FROM embed_queue WHERE version_id = ANY(%s) RETURNING tenant",
}


def _key(settings: Settings, name: str) -> str:
    return f"{settings.pg_schema}.{name}"


def reindex_key(settings: Settings) -> str:
    """One key per schema: the indexers (shared) and a reindex (exclusive) never write the same index at once."""
    return _key(settings, "search_indexer")


def writing(conn: psycopg.Connection, settings: Settings) -> bool:
    """In the caller's transaction: whether no reindex runs (the shared lock is held until the transaction ends)."""
    row = conn.execute("SELECT pg_try_advisory_xact_lock_shared(hashtextextended(%s, 0))", (reindex_key(settings),))
    return bool(row.fetchone()[0])  # type: ignore[index]


def take_reindex(conn: psycopg.Connection, settings: Settings) -> None:
    """A session lock: waits for the indexers' batches in flight, then keeps new ones out until released."""
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (reindex_key(settings),))


def release_reindex(conn: psycopg.Connection, settings: Settings) -> None:
    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (reindex_key(settings),))


def finish(conn: psycopg.Connection, settings: Settings) -> None:
    """In the caller's transaction, before its closing statements: serialize them with every other batch's."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_key(settings, "search_finish"),))


def delete_claimed(conn: psycopg.Connection | psycopg.Cursor, queue: str, keys: Sequence[int | str]) -> list[str]:
    """Delete `queue`'s rows with these keys (search_outbox: ids, embed_queue: version ids); each deleted row's
    tenant."""
    return [tenant for (tenant,) in conn.execute(DELETE_CLAIMED[queue], (list(keys),)).fetchall()]


# The tenants with rows waiting, the longest waiting first (each one's oldest row), at most %s of them: a walk of
# the queue's (tenant, id) index, two probes per tenant waiting, not a scan of the queue.
_WAITING = """
WITH RECURSIVE waiting(tenant) AS (
  (SELECT tenant FROM {queue} WHERE {only} ORDER BY tenant LIMIT 1)
  UNION ALL
  SELECT (SELECT q.tenant FROM {queue} q WHERE {only} AND q.tenant > w.tenant ORDER BY q.tenant LIMIT 1)
  FROM waiting w WHERE w.tenant IS NOT NULL)
SELECT w.tenant FROM waiting w
CROSS JOIN LATERAL (SELECT min(id) AS first FROM {queue} e WHERE {only} AND e.tenant = w.tenant) f
WHERE w.tenant IS NOT NULL ORDER BY f.first LIMIT %s"""
# each waiting tenant's share of the batch, its oldest unclaimed rows
_SHARES = """
SELECT q.* FROM unnest(%s::text[], %s::int[]) AS w(tenant, share)
CROSS JOIN LATERAL (SELECT {columns} FROM {queue} e WHERE {only} AND e.tenant = w.tenant ORDER BY id
                    LIMIT w.share FOR UPDATE SKIP LOCKED) q"""
# what the shares left of the batch (a tenant with fewer rows than its share), oldest first
_REST = "SELECT {columns} FROM {queue} WHERE {only} AND id <> ALL(%s) ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"


def claim_fairly(
    conn: psycopg.Connection, queue: str, columns: str, batch_size: int, only: str = "TRUE"
) -> list[tuple]:
    """In the caller's transaction: lock up to `batch_size` of `queue`'s unclaimed rows (those `only` admits: a
    constant SQL condition, which the queue's (tenant, id) index for the walk must have as its own), as tuples of
    `columns`, `id` first, in id order.

    The batch is shared among the tenants waiting, the longest waiting first, each its oldest rows: a tenant's
    backlog of thousands holds another tenant's one new row back by one batch, not by the whole backlog (and so
    says nothing of its size); what a share leaves unused goes to the oldest rows of any tenant. A tenant's rows
    are still taken oldest first, as a plain queue would take them."""
    parts = {"queue": sql.Identifier(queue), "columns": sql.SQL(columns), "only": sql.SQL(only)}
    waiting = [t for (t,) in conn.execute(sql.SQL(_WAITING).format(**parts), (batch_size,)).fetchall()]
    if not waiting:
        return []
    shares = [batch_size // len(waiting) + (i < batch_size % len(waiting)) for i in range(len(waiting))]
    queued = conn.execute(sql.SQL(_SHARES).format(**parts), (waiting, shares)).fetchall()
    if len(queued) < batch_size:
        taken = [row[0] for row in queued]
        queued += conn.execute(sql.SQL(_REST).format(**parts), (taken, batch_size - len(queued))).fetchall()
    queued.sort()
    return queued

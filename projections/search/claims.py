"""The locks that let any number of indexers and embedders share one schema's work.

- Work is claimed row by row: `FOR UPDATE SKIP LOCKED` on search_outbox (indexers) and embed_queue (embedders),
  inside the transaction that finishes it, so a process killed mid-batch releases its rows with its connection
  and another takes them; two never hold the same row.
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

from producers.settings import Settings

__all__ = ["DELETE_CLAIMED", "delete_claimed", "finish", "reindex_key", "release_reindex", "take_reindex", "writing"]

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

"""The search indexer: drains `search_outbox` into Elasticsearch (`ledger indexer`), any number at once.

A batch is claimed, written and its outbox rows deleted in one transaction, so a crash anywhere leaves it for
another indexer. No embedding happens here: a version lacking vectors goes to `embed_queue` (the embedders') and
comes back when they are stored. Documents carry their version's revision as an external version, so whichever
indexer writes last, Elasticsearch keeps the newest state. docs/INTERNALS.md, "Elasticsearch".
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from elasticsearch import Elasticsearch
from elasticsearch.helpers import streaming_bulk
from psycopg import sql
from psycopg.rows import dict_row

from producers.keys.store import search_purged, settings_keks
from producers.metrics import serve as serve_metrics
from producers.settings import Settings
from projections.models import model_spec
from projections.postgres.connection import search_path
from projections.postgres.counts import INDEXER_SHARD, OUTBOX, add_counts
from projections.search import metrics
from projections.search.claims import claim_fairly, delete_claimed, finish, reindex_key, writing
from projections.search.client import es_client
from projections.search.documents import build_doc, rows_sql
from projections.search.drain import (
    EMBED_CHANNEL,
    ERASURE_CHANNEL,
    INDEXED_CHANNEL,
    OUTBOX_CHANNEL,
    drain_forever,
    notify,
)
from projections.search.duplicates import GROUP_COLUMN
from projections.search.ids import doc_ids, tenant_query
from projections.search.mapping import ensure_index
from projections.search.vectors import VECTOR_COLUMNS, attached, lacking, queue_for_vectors
from projections.search.vocab import log_indexed

__all__ = ["DOC_EXTRA", "DrainStats", "doc_action", "drain_once", "lock_key", "read_rows", "run_indexer"]

log = logging.getLogger("ledger.indexer")

# A batch holds one kind of row (schema.sql, `priority`): new or changed versions' documents (0), claimed first
# (what exact and keyword recall wait for) and shared among the tenants waiting (claims.claim_fairly), or, when none
# waits, the embedders' vector rewrites (1), at most `indexer_rewrite_batch_size` of them, so a new document waits
# behind one small rewrite batch at most.
CLAIMED_COLUMNS = "id, version_id, tenant, subject, op, created_at"
FIRST_WRITES = "priority = 0"  # the condition of the index the claim walks (schema.sql, search_outbox_first)
CLAIM_REWRITES = (
    f"SELECT {CLAIMED_COLUMNS} FROM search_outbox WHERE priority > 0 ORDER BY priority, id LIMIT %s "
    "FOR UPDATE SKIP LOCKED"
)
BATCH_SIZE = 500  # drain_once's default for callers without settings at hand (tests); the runner uses the settings


def lock_key(settings: Settings) -> str:
    """The reindex lock's key (projections.search.claims): indexers hold it shared, a reindex exclusively."""
    return reindex_key(settings)


@dataclass
class DrainStats:
    rows: int = 0
    indexed: int = 0
    updated: int = 0  # kept for the metrics' labels: every write is a whole document now
    deleted: int = 0
    stale: int = 0  # writes Elasticsearch refused because a newer revision was already there
    queued: int = 0  # versions sent to the embed queue (a configured vector not stored yet)
    first_writes: int = 0  # rows of new or changed versions (priority 0) in this batch
    limit: int = 0  # the size of a full batch of the kind claimed (fewer rows: that queue is drained)
    failed: list[dict[str, Any]] = field(default_factory=list)


def _set_path(conn: psycopg.Connection, settings: Settings) -> None:
    conn.execute(search_path(settings.pg_schema))


def _ensure(es: Elasticsearch, settings: Settings) -> None:
    """Checked every batch (one cheap request): writing to a vanished alias would auto-create an index
    with dynamic mappings (no dense_vector, no CJK analyzer) under the alias's name."""
    ensure_index(es, settings, model_spec(settings.embed_model).dim)


def _bulk(es: Elasticsearch, actions: list[dict[str, Any]], refresh: bool) -> list[tuple[bool, dict[str, Any]]]:
    """Per-document results; 429s are retried with capped exponential backoff by the helper."""
    if not actions:
        return []
    return list(
        streaming_bulk(
            es,
            actions,
            chunk_size=500,
            max_chunk_bytes=20 * 1024 * 1024,
            max_retries=6,
            initial_backoff=0.5,
            max_backoff=16,
            raise_on_error=False,
            raise_on_exception=True,
            refresh="wait_for" if refresh else False,
        )
    )


def _delete_subjects(
    conn: psycopg.Connection, es: Elasticsearch, index: str, subjects: Iterable[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Make the index hold exactly PostgreSQL's versions of each erased subject: delete the rest.

    The index is listed before PostgreSQL is read: a version written after the erasure is in PostgreSQL before
    its document exists, so it is never deleted here."""
    actions: list[dict[str, Any]] = []
    for tenant, subject in subjects:
        in_es = doc_ids(es, index, tenant_query(tenant, subject=subject))  # no delete_by_query on this server
        if not in_es:
            continue
        in_pg = {
            r[0]
            for r in conn.execute(
                "SELECT version_id FROM fact_versions WHERE tenant = %s AND subject = %s", (tenant, subject)
            )
        }
        actions += [{"_op_type": "delete", "_index": index, "_id": vid} for vid in sorted(in_es - in_pg)]
    return actions


# what a document needs beside the row: its revision, its stored vectors, its near-duplicate group
DOC_EXTRA = sql.SQL("f.rev, ") + VECTOR_COLUMNS + sql.SQL(", " + GROUP_COLUMN)


def read_rows(conn: psycopg.Connection, version_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The current rows of `version_ids` with their revision and stored vectors, in one snapshot."""
    query = rows_sql(sql.SQL("f.version_id = ANY(%s)"), extra=DOC_EXTRA)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, (version_ids,))
        return {r["version_id"]: r for r in cur.fetchall()}


def doc_action(settings: Settings, index: str, row: dict[str, Any]) -> dict[str, Any]:
    """The bulk action writing `row`'s whole document at its revision (an older revision than the index's is
    refused by Elasticsearch: a 409 that means a newer state is already there)."""
    return {
        "_op_type": "index",
        "_index": index,
        "_id": row["version_id"],
        "version": row["rev"],
        "version_type": "external_gte",
        "_source": build_doc(row, None, vectors=attached(settings, row)),
    }


def drain_once(
    settings: Settings,
    conn: psycopg.Connection,
    es: Elasticsearch,
    *,
    batch_size: int = BATCH_SIZE,
    refresh: bool = False,
    stats: DrainStats | None = None,
) -> int:
    """Claim one batch of the outbox and move it into the index; returns how many outbox rows it consumed.

    Returns 0 when the outbox has no unclaimed row or a reindex runs. Rows whose document failed stay in the
    outbox for the next call. `conn` is an autocommit connection: the batch is one transaction of its own.
    """
    stats = stats if stats is not None else DrainStats()
    _set_path(conn, settings)
    with conn.transaction():
        if not writing(conn, settings):
            return 0
        return _drain(settings, conn, es, batch_size, refresh, stats)


def _drain(
    settings: Settings, conn: psycopg.Connection, es: Elasticsearch, batch_size: int, refresh: bool, stats: DrainStats
) -> int:
    batch = claim_fairly(conn, "search_outbox", CLAIMED_COLUMNS, batch_size, FIRST_WRITES)
    stats.first_writes, stats.limit = len(batch), batch_size
    if not batch:  # no new or changed version waits: vector rewrites, in smaller batches (they carry the vectors)
        stats.limit = max(1, min(batch_size, settings.indexer_rewrite_batch_size))
        batch = conn.execute(CLAIM_REWRITES, (stats.limit,)).fetchall()
    if not batch:
        return 0
    _ensure(es, settings)
    index = settings.es_index

    erased = sorted({(t, s) for _, _, t, s, op, _ in batch if op == "delete_subject"})
    version_ids = sorted({vid for _, vid, _, _, op, _ in batch if op == "upsert" and vid})
    rows = read_rows(conn, version_ids)

    # erasures first: the upserts below re-assert whatever PostgreSQL still holds
    failed_ids: set[str] = set()
    per_subject = {pair: _delete_subjects(conn, es, index, [pair]) for pair in erased}
    actions = [a for pair in erased for a in per_subject[pair]]
    actions += [{"_op_type": "delete", "_index": index, "_id": v} for v in version_ids if v not in rows]
    actions += [doc_action(settings, index, rows[v]) for v in version_ids if v in rows]

    for ok, info in _bulk(es, actions, refresh):
        op, res = next(iter(info.items()))
        status = res.get("status", 0)
        if ok or (op == "delete" and status == 404):
            stats.indexed += op == "index"
            stats.deleted += op == "delete"
        elif op == "index" and status == 409:  # a newer revision is in the index already: nothing to write
            stats.stale += 1
        else:
            failed_ids.add(res["_id"])
            stats.failed.append(res)

    done = [
        oid
        for oid, vid, tenant, subject, op, _ in batch
        if (vid not in failed_ids if op == "upsert" else not failed_ids)  # an erasure retries on any failure
    ]
    since: dict[str, Any] = {}  # each version's first outbox row: (created, id)
    for oid, vid, _, _, op, created in batch:
        if op == "upsert" and vid in rows and vid not in failed_ids:
            since[vid] = min(since.get(vid, (created, oid)), (created, oid))
    # queued in the order they were written, so the embedders' oldest-first is the writers' order too
    unembedded = [
        (v, rows[v]["tenant"], since[v][0]) for v in sorted(since, key=since.__getitem__) if lacking(settings, rows[v])
    ]
    finish(conn, settings)  # the closing statements, serialized with every other indexer's and embedder's
    gone = delete_claimed(conn, "search_outbox", done)
    deltas: Counter = Counter()
    for tenant in gone:  # /v1/stats' counters, in the same transaction (projections.postgres.counts)
        deltas[(tenant, OUTBOX)] -= 1
    if gone:
        notify(conn, INDEXED_CHANNEL)  # reads waiting for these documents (api.consistency) wake when this commits
    queued = queue_for_vectors(conn, unembedded)
    if queued:
        notify(conn, EMBED_CHANNEL)  # the embedders wake when this commits
    deltas.update(queued)
    stats.queued += sum(queued.values())
    add_counts(conn, deltas, shard=INDEXER_SHARD)
    # what is now searchable, for the API's vocabularies (projections.search.vocab)
    log_indexed(conn, [(t, v) for _, v, t, _, op, _ in batch if op == "upsert" and v in rows and v not in failed_ids])
    if erased and not failed_ids:  # the erasure records learn what the search projection deleted
        for (tenant, subject), deletes in per_subject.items():
            search_purged(conn.cursor(), settings.keys_schema, tenant, subject, len(deletes), settings_keks(settings))
    stats.rows += len(done)
    if stats.failed:
        log.warning("indexer: %d documents failed, kept in the outbox: %s", len(failed_ids), stats.failed[:3])
    return len(done)


def run_indexer(
    settings: Settings, *, poll_seconds: float | None = None, batch_size: int | None = None, stop=None
) -> None:
    """Drain forever (until `stop()` returns true) in the one drain loop (projections.search.drain): woken by the
    recorder's commits (new outbox rows, erasures) and the embedders' stored vectors.

    `poll_seconds` (the longest wait for a notification), `batch_size` and the longest back-off default to the
    settings (LEDGER_INDEXER_POLL_S, LEDGER_INDEXER_BATCH_SIZE, LEDGER_INDEXER_MAX_BACKOFF_S).
    """
    poll_seconds = settings.indexer_poll_s if poll_seconds is None else poll_seconds
    batch_size = settings.indexer_batch_size if batch_size is None else batch_size
    es = es_client(settings, request_timeout=30)
    total, t0 = 0, time.monotonic()
    metrics.register()
    serve_metrics(settings.indexer_metrics_port, settings.metrics_host, setting="LEDGER_INDEXER_METRICS_PORT")
    log.info("indexer: draining %s.search_outbox into %s", settings.pg_schema, settings.es_index)

    def once(conn: psycopg.Connection) -> bool:
        nonlocal total
        stats, started = DrainStats(), time.perf_counter()
        n = drain_once(settings, conn, es, batch_size=batch_size, stats=stats)
        if n or stats.failed:
            metrics.record_drain(
                indexed=stats.indexed,
                updated=stats.updated,
                deleted=stats.deleted,
                failed=len(stats.failed),
                rows=stats.rows,
                seconds=time.perf_counter() - started,
                stale=stats.stale,
            )
        total += n
        if 0 < n < stats.limit:
            # caught up: make this small batch searchable now instead of at the index's next refresh; a bulk
            # catch-up leaves refreshing to the index's interval, as a refresh per full batch slows it
            es.indices.refresh(index=settings.es_index)
        if n:
            log.info("indexer: %d rows (%d total, %.0f rows/s)", n, total, total / (time.monotonic() - t0))
        return n > 0 and n >= stats.limit  # a full batch: more may wait

    drain_forever(
        settings,
        once,
        channels=(OUTBOX_CHANNEL, ERASURE_CHANNEL),
        poll_seconds=poll_seconds,
        log=log,
        record_error=metrics.record_drain_error,
        stop=stop,
    )

"""The search indexer: drains `search_outbox` into Elasticsearch (`ledger indexer`).

The PostgreSQL projection writes an outbox row in the same transaction as every version
it inserts or changes. The indexer takes a batch in id order, reads the *current* rows of
those versions, bulk-writes their documents and only then deletes exactly those outbox
rows. A crash between the two redoes the batch: ids are the version ids and the
documents are built from current state, so redoing changes nothing. While
Elasticsearch is down the loop backs off and the outbox grows; PostgreSQL is never
blocked. One indexer per schema drains at a time (a session advisory lock).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from elasticsearch import ApiError, Elasticsearch
from elasticsearch import ConnectionError as ESConnectionError
from elasticsearch.helpers import streaming_bulk
from psycopg import sql
from psycopg.rows import dict_row

from producers.keys.store import search_purged
from producers.logs import bind_ids, new_id, unbind_ids
from producers.metrics import serve as serve_metrics
from producers.settings import Settings
from projections.embedding import Embedder, Embedders, load_embedder
from projections.postgres.counts import INDEXER_SHARD, OUTBOX, add_counts
from projections.search import metrics
from projections.search.documents import build_doc, embedding_text_for, rows_sql, status_fields
from projections.search.ids import doc_ids, tenant_query
from projections.search.mapping import ensure_index
from projections.search.vocab import log_indexed

__all__ = ["drain_once", "lock_key", "run_indexer", "DrainStats"]

log = logging.getLogger("ledger.indexer")

BATCH_SIZE = 500  # drain_once's default for callers without settings at hand (tests); the runner uses the settings


def lock_key(settings: Settings) -> str:
    """One advisory lock per schema: the indexer and a reindex never write the same index at once."""
    return f"{settings.pg_schema}.search_indexer"


@dataclass
class DrainStats:
    rows: int = 0
    indexed: int = 0
    updated: int = 0
    deleted: int = 0
    embedded: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)


def _set_path(conn: psycopg.Connection, settings: Settings) -> None:
    conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(settings.pg_schema)))


def try_lock(conn: psycopg.Connection, key: str) -> bool:
    return bool(conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)).fetchone()[0])


def unlock(conn: psycopg.Connection, key: str) -> None:
    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


def _ensure(es: Elasticsearch, settings: Settings, dim: int) -> None:
    """Checked every batch (one cheap request): writing to a vanished alias would auto-create an index
    with dynamic mappings (no dense_vector, no CJK analyzer) under the alias's name."""
    ensure_index(es, settings, dim)


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
    """Make the index hold exactly PostgreSQL's versions of each erased subject: delete the rest."""
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


def _read_rows(conn: psycopg.Connection, version_ids: list[str]) -> dict[str, dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(rows_sql(sql.SQL("f.version_id = ANY(%s)")), (version_ids,))
        return {r["version_id"]: r for r in cur.fetchall()}


def _existing(es: Elasticsearch, index: str, ids: list[str]) -> set[str]:
    if not ids:
        return set()
    docs = es.mget(index=index, ids=ids, source=False)["docs"]
    return {d["_id"] for d in docs if d.get("found")}


def _index_actions(index: str, rows: list[dict[str, Any]], embedder: Embedders, stats: DrainStats) -> list[dict]:
    if not rows:
        return []
    started = time.perf_counter()
    vectors = embedder.vectors([embedding_text_for(r) for r in rows])  # each by its language's model (issue 15)
    metrics.embedding(len(rows), time.perf_counter() - started)
    stats.embedded += len(rows)
    return [
        {"_op_type": "index", "_index": index, "_id": r["version_id"], "_source": build_doc(r, None, vectors=v)}
        for r, v in zip(rows, vectors, strict=True)
    ]


def drain_once(
    settings: Settings,
    conn: psycopg.Connection,
    es: Elasticsearch,
    embedder: Embedder | Embedders,
    *,
    batch_size: int = BATCH_SIZE,
    refresh: bool = False,
    stats: DrainStats | None = None,
) -> int:
    """Move one batch of the outbox into the index; returns how many outbox rows it consumed.

    Returns 0 when the outbox is empty or another indexer holds the lock. Rows whose
    document failed stay in the outbox for the next call.
    """
    stats = stats if stats is not None else DrainStats()
    _set_path(conn, settings)
    key = lock_key(settings)
    if not try_lock(conn, key):
        return 0
    try:
        return _drain(settings, conn, es, Embedders.of(settings, embedder), batch_size, refresh, stats)
    finally:
        unlock(conn, key)


def _drain(
    settings: Settings,
    conn: psycopg.Connection,
    es: Elasticsearch,
    embedder: Embedders,
    batch_size: int,
    refresh: bool,
    stats: DrainStats,
) -> int:
    batch = conn.execute(
        "SELECT id, version_id, tenant, subject, op FROM search_outbox ORDER BY id LIMIT %s", (batch_size,)
    ).fetchall()
    if not batch:
        return 0
    _ensure(es, settings, embedder.dim)
    index = settings.es_index

    erased = sorted({(t, s) for _, _, t, s, op in batch if op == "delete_subject"})
    version_ids = sorted({vid for _, vid, _, _, op in batch if op == "upsert" and vid})
    rows = _read_rows(conn, version_ids)
    existing = _existing(es, index, [v for v in version_ids if v in rows])

    # erasures first: the upserts below re-assert whatever PostgreSQL still holds
    failed_ids: set[str] = set()
    per_subject = {pair: _delete_subjects(conn, es, index, [pair]) for pair in erased}
    actions = [a for pair in erased for a in per_subject[pair]]
    actions += [{"_op_type": "delete", "_index": index, "_id": v} for v in version_ids if v not in rows]
    actions += [
        {"_op_type": "update", "_index": index, "_id": v, "doc": status_fields(rows[v])}
        for v in version_ids
        if v in existing
    ]
    actions += _index_actions(index, [rows[v] for v in version_ids if v in rows and v not in existing], embedder, stats)

    missing: list[str] = []
    for ok, info in _bulk(es, actions, refresh):
        op, res = next(iter(info.items()))
        status = res.get("status", 0)
        if ok or (op == "delete" and status == 404):
            stats.indexed += op == "index"
            stats.updated += op == "update"
            stats.deleted += op == "delete"
        elif op == "update" and status == 404:  # deleted since the mget: write it whole
            missing.append(res["_id"])
        else:
            failed_ids.add(res["_id"])
            stats.failed.append(res)
    if missing:
        for ok, info in _bulk(es, _index_actions(index, [rows[v] for v in missing], embedder, stats), refresh):
            res = next(iter(info.values()))
            if ok:
                stats.indexed += 1
            else:
                failed_ids.add(res["_id"])
                stats.failed.append(res)

    done = [
        oid
        for oid, vid, tenant, subject, op in batch
        if (vid not in failed_ids if op == "upsert" else not failed_ids)  # an erasure retries on any failure
    ]
    with conn.transaction():
        gone = conn.execute("DELETE FROM search_outbox WHERE id = ANY(%s) RETURNING tenant", (done,)).fetchall()
        # /v1/stats' outbox counters, in the same transaction (projections.postgres.counts)
        removed = Counter((tenant, OUTBOX) for (tenant,) in gone)
        add_counts(conn, {k: -n for k, n in removed.items()}, shard=INDEXER_SHARD)
        # issue 14: what is now searchable, for the API's vocabularies (projections.search.vocab)
        log_indexed(conn, [(t, v) for _, v, t, _, op in batch if op == "upsert" and v in rows and v not in failed_ids])
        if erased and not failed_ids:  # issue 13: the erasure records learn what the search projection deleted
            for (tenant, subject), deletes in per_subject.items():
                search_purged(conn.cursor(), settings.keys_schema, tenant, subject, len(deletes))
    stats.rows += len(done)
    if stats.failed:
        log.warning("indexer: %d documents failed, kept in the outbox: %s", len(failed_ids), stats.failed[:3])
    return len(done)


def _connect(settings: Settings) -> psycopg.Connection:
    conn = psycopg.connect(settings.pg_dsn, autocommit=True)
    _set_path(conn, settings)
    return conn


def run_indexer(
    settings: Settings, *, poll_seconds: float | None = None, batch_size: int | None = None, stop=None
) -> None:
    """Drain forever (until `stop()` returns true): back off on errors, never give up.

    `poll_seconds`, `batch_size` and the longest back-off default to the settings
    (LEDGER_INDEXER_POLL_S, LEDGER_INDEXER_BATCH_SIZE, LEDGER_INDEXER_MAX_BACKOFF_S).
    """
    poll_seconds = settings.indexer_poll_s if poll_seconds is None else poll_seconds
    batch_size = settings.indexer_batch_size if batch_size is None else batch_size
    embedder = Embedders(settings, load_embedder(settings))
    es = Elasticsearch(settings.es_url, request_timeout=30)
    conn: psycopg.Connection | None = None
    backoff = 0.5
    total, t0 = 0, time.monotonic()
    metrics.register()
    serve_metrics(settings.indexer_metrics_port, settings.metrics_host, setting="LEDGER_INDEXER_METRICS_PORT")
    gauges_at = -settings.metrics_refresh_s  # the outbox gauges are read after the first drain
    log.info("indexer: draining %s.search_outbox into %s", settings.pg_schema, settings.es_index)
    batch_ids = bind_ids()
    while stop is None or not stop():
        unbind_ids(batch_ids)
        batch_ids = bind_ids(batch_id=new_id())  # on every line of this round (producers.logs)
        try:
            if conn is None or conn.closed:
                conn = _connect(settings)
            stats, started = DrainStats(), time.perf_counter()
            n = drain_once(settings, conn, es, embedder, batch_size=batch_size, stats=stats)
            if n or stats.failed:
                metrics.record_drain(
                    indexed=stats.indexed,
                    updated=stats.updated,
                    deleted=stats.deleted,
                    failed=len(stats.failed),
                    rows=stats.rows,
                    seconds=time.perf_counter() - started,
                )
            if time.monotonic() - gauges_at >= settings.metrics_refresh_s:
                metrics.refresh_outbox(conn)
                gauges_at = time.monotonic()
            backoff = 0.5
            total += n
            if 0 < n < batch_size:
                # caught up: make this small batch searchable now instead of at the next 1 s refresh
                # (a bulk catch-up leaves refreshing to the index's own interval)
                es.indices.refresh(index=settings.es_index)
            if n:
                log.info("indexer: %d rows (%d total, %.0f rows/s)", n, total, total / (time.monotonic() - t0))
            if n < batch_size:
                time.sleep(poll_seconds)
        except Exception as exc:  # noqa: BLE001 - a long-running drainer backs off and retries, never dies
            expected = isinstance(exc, (ESConnectionError, ApiError, psycopg.Error))
            es_error = isinstance(exc, (ESConnectionError, ApiError))
            metrics.record_drain_error(
                "elasticsearch" if es_error else "postgres" if isinstance(exc, psycopg.Error) else "other"
            )
            log.warning(
                "indexer: %s: %s; retrying in %.1fs",
                type(exc).__name__,
                str(exc)[:300],
                backoff,
                exc_info=not expected,
            )
            if conn is not None and (isinstance(exc, psycopg.OperationalError) or conn.broken):
                conn.close()
                conn = None
            time.sleep(backoff)
            # capped low: once Elasticsearch is back the index should catch up in seconds, not half a minute
            backoff = min(backoff * 2, settings.indexer_max_backoff_s)

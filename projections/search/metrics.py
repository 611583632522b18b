"""The search indexers' and embedders' metrics (docs/metrics.md), served by `ledger indexer` on
LEDGER_INDEXER_METRICS_PORT and by `ledger embedder` on LEDGER_EMBEDDER_METRICS_PORT (two processes).

The indexer: what each drain wrote (`record_drain`) and two gauges read every `metrics_refresh_s`
(`refresh_queues`): the outbox depth (documents still to write) and the embed queue's depth (documents without
a configured vector yet). The embedder: what each batch embedded (`record_embed`, `embedding`), the queue depth
and the age of its oldest version, the semantic lag (`refresh_queues` too).

The families are registered by those processes only (`register`): the API imports this module too (its
stats and orphan checks reach projections.search.indexer), and must not show an outbox depth of 0 of its own.
Recall's per-stage latency lives in projections.search.recall.metrics.
"""

from __future__ import annotations

import threading

import psycopg
from prometheus_client import REGISTRY, CollectorRegistry

from producers.metrics import BATCH_BUCKETS, counter, gauge, histogram

__all__ = [
    "EMBEDDER_FAMILIES",
    "INDEXER_FAMILIES",
    "embedding",
    "record_drain",
    "record_drain_error",
    "record_embed",
    "record_embed_error",
    "refresh_queues",
    "register",
]

_UNREGISTERED = {"registry": None}  # see the module docstring: `register` adds them to the default registry

DOCUMENTS = counter(
    "indexer_documents_total",
    "Documents the indexer wrote to Elasticsearch, by operation: index (a version's whole document, with the "
    "vectors stored so far), update (no longer written: kept at 0 for dashboards), delete (a version or an erased "
    "subject's document gone from PostgreSQL), stale (a write refused because a newer revision was indexed)",
    ("op",),
    **_UNREGISTERED,
)
OUTBOX_ROWS = counter(
    "indexer_outbox_rows_total", "search_outbox rows the indexer consumed (deleted once written)", **_UNREGISTERED
)
FAILED = counter(
    "indexer_failed_documents_total",
    "Documents Elasticsearch refused; their outbox rows stay for the next batch",
    **_UNREGISTERED,
)
DRAIN_SECONDS = histogram(
    "indexer_batch_duration_seconds",
    "Time of one outbox batch that consumed rows, read to outbox rows deleted",
    buckets=BATCH_BUCKETS,
    **_UNREGISTERED,
)
DRAIN_ERRORS = counter(
    "indexer_errors_total",
    "Drains that failed and were retried with back-off, by store (elasticsearch, postgres, other)",
    ("store",),
    **_UNREGISTERED,
)
OUTBOX_DEPTH = gauge(
    "indexer_outbox_depth", "Rows in search_outbox (upserts and subject deletions) not yet indexed", **_UNREGISTERED
)
VECTORS_PENDING = gauge(
    "indexer_vectors_pending",
    "Versions in embed_queue: documents written without a configured model's vector yet (semantic recall does "
    "not see them until an embedder stores it and the next batch writes it)",
    **_UNREGISTERED,
)
INDEXER_FAMILIES = (DOCUMENTS, OUTBOX_ROWS, FAILED, DRAIN_SECONDS, DRAIN_ERRORS, OUTBOX_DEPTH, VECTORS_PENDING)

EMBED_SECONDS = histogram(
    "embedder_embedding_duration_seconds",
    "Time of one embedding call of the embedder (a batch of texts of one model)",
    buckets=BATCH_BUCKETS,
    **_UNREGISTERED,
)
EMBEDDED = counter(
    "embedder_texts_total", "Texts the embedder embedded (one per model a version needs)", **_UNREGISTERED
)
EMBED_VERSIONS = counter(
    "embedder_versions_total",
    "Versions the embedder finished, by outcome: stored (vectors stored, document queued for rewriting), "
    "complete (already had them), gone (erased or replaced before it got there)",
    ("outcome",),
    **_UNREGISTERED,
)
EMBED_BATCH_SECONDS = histogram(
    "embedder_batch_duration_seconds",
    "Time of one embedder batch that finished versions, claim to commit",
    buckets=BATCH_BUCKETS,
    **_UNREGISTERED,
)
EMBED_ERRORS = counter(
    "embedder_errors_total",
    "Embedder batches that failed and were retried with back-off, by store (postgres, elasticsearch, other)",
    ("store",),
    **_UNREGISTERED,
)
QUEUE_DEPTH = gauge(
    "embedder_queue_depth", "Versions in embed_queue (documents without their vectors)", **_UNREGISTERED
)
QUEUE_AGE = gauge(
    "embedder_oldest_pending_seconds",
    "Age of the oldest version in embed_queue since PostgreSQL had it: the semantic lag (0 when the queue is empty)",
    **_UNREGISTERED,
)
EMBEDDER_FAMILIES = (EMBED_SECONDS, EMBEDDED, EMBED_VERSIONS, EMBED_BATCH_SECONDS, EMBED_ERRORS, QUEUE_DEPTH, QUEUE_AGE)

_OPS = {op: DOCUMENTS.labels(op) for op in ("index", "update", "delete", "stale")}
for _store in ("elasticsearch", "postgres", "other"):
    DRAIN_ERRORS.labels(_store)  # at 0 from the start, so a rate() sees the first error
for _store in ("postgres", "elasticsearch", "other"):
    EMBED_ERRORS.labels(_store)
for _outcome in ("stored", "complete", "gone"):
    EMBED_VERSIONS.labels(_outcome)
_registered: set[tuple[int, int]] = set()
_lock = threading.Lock()


def register(registry: CollectorRegistry = REGISTRY, families: tuple = INDEXER_FAMILIES) -> None:
    """Add `families` (the indexer's, or EMBEDDER_FAMILIES) to `registry` (idempotent); each runner calls it."""
    with _lock:
        for family in families:
            if (id(registry), id(family)) in _registered:
                continue
            registry.register(family)
            _registered.add((id(registry), id(family)))


def record_drain(
    *, indexed: int, updated: int, deleted: int, failed: int, rows: int, seconds: float, stale: int = 0
) -> None:
    """One drain that consumed outbox rows (the `DrainStats` of one `drain_once`)."""
    for op, n in (("index", indexed), ("update", updated), ("delete", deleted), ("stale", stale)):
        if n:
            _OPS[op].inc(n)
    if failed:
        FAILED.inc(failed)
    OUTBOX_ROWS.inc(rows)
    DRAIN_SECONDS.observe(seconds)


def record_drain_error(store: str) -> None:
    DRAIN_ERRORS.labels(store).inc()


def embedding(texts: int, seconds: float) -> None:
    """One embedding call of `texts` texts."""
    EMBEDDED.inc(texts)
    EMBED_SECONDS.observe(seconds)


def record_embed(*, stored: int, complete: int, gone: int, seconds: float) -> None:
    """One embedder batch that finished versions."""
    for outcome, n in (("stored", stored), ("complete", complete), ("gone", gone)):
        if n:
            EMBED_VERSIONS.labels(outcome).inc(n)
    EMBED_BATCH_SECONDS.observe(seconds)


def record_embed_error(store: str) -> None:
    EMBED_ERRORS.labels(store).inc()


def refresh_queues(conn: psycopg.Connection) -> None:
    """Read the queue gauges: two counts and the oldest pending version (`conn` has the projection schema on its
    path). Both processes set all of them; each serves its own families only."""
    depth, embed, oldest = conn.execute(
        "SELECT (SELECT count(*) FROM search_outbox), (SELECT count(*) FROM embed_queue), "
        "(SELECT extract(epoch FROM now() - since) FROM embed_queue ORDER BY id LIMIT 1)"
    ).fetchone()
    OUTBOX_DEPTH.set(depth)
    VECTORS_PENDING.set(embed)
    QUEUE_DEPTH.set(embed)
    QUEUE_AGE.set(float(oldest or 0.0))

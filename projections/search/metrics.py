"""The search indexer's metrics (docs/metrics.md), served by `ledger indexer` on LEDGER_INDEXER_METRICS_PORT.

What each drain wrote (`record_drain`), how long embedding took (`embedding`), and two gauges read from
`search_outbox` every `metrics_refresh_s` (`refresh_outbox`): its depth, and the versions in it awaiting a
vector. The indexer embeds a new version's text in the same batch that writes its document, so no document is
ever in the index without its vector: "awaiting a vector" counts the distinct versions with a pending upsert, an
upper bound on the embeddings still to compute (a version already indexed is updated in place, not embedded again).

The families are registered by the indexer process only (`register`): the API imports this module too (its
stats and orphan checks reach projections.search.indexer), and must not show an outbox depth of 0 of its own.
Recall's per-stage latency lives in projections.search.recall.metrics.
"""

from __future__ import annotations

import threading

import psycopg
from prometheus_client import REGISTRY, CollectorRegistry

from producers.metrics import BATCH_BUCKETS, counter, gauge, histogram

__all__ = ["embedding", "record_drain", "record_drain_error", "refresh_outbox", "register"]

_UNREGISTERED = {"registry": None}  # see the module docstring: `register` adds them to the default registry

DOCUMENTS = counter(
    "indexer_documents_total",
    "Documents the indexer wrote to Elasticsearch, by operation: index (a new version, embedded), update (status "
    "fields of an indexed version), delete (a version or an erased subject's document gone from PostgreSQL)",
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
EMBED_SECONDS = histogram(
    "indexer_embedding_duration_seconds",
    "Time of one embedding call of the indexer (a batch of texts)",
    buckets=BATCH_BUCKETS,
    **_UNREGISTERED,
)
EMBEDDED = counter("indexer_embedded_texts_total", "Texts the indexer embedded", **_UNREGISTERED)
OUTBOX_DEPTH = gauge(
    "indexer_outbox_depth", "Rows in search_outbox (upserts and subject deletions) not yet indexed", **_UNREGISTERED
)
VECTORS_PENDING = gauge(
    "indexer_vectors_pending",
    "Distinct versions with a pending upsert in search_outbox: at most this many embeddings still to compute (the "
    "indexer embeds in the batch that writes the document, so no indexed document lacks its vector)",
    **_UNREGISTERED,
)
FAMILIES = (
    DOCUMENTS,
    OUTBOX_ROWS,
    FAILED,
    DRAIN_SECONDS,
    DRAIN_ERRORS,
    EMBED_SECONDS,
    EMBEDDED,
    OUTBOX_DEPTH,
    VECTORS_PENDING,
)

_OPS = {op: DOCUMENTS.labels(op) for op in ("index", "update", "delete")}
for _store in ("elasticsearch", "postgres", "other"):
    DRAIN_ERRORS.labels(_store)  # at 0 from the start, so a rate() sees the first error
_registered: set[int] = set()
_lock = threading.Lock()


def register(registry: CollectorRegistry = REGISTRY) -> None:
    """Add the indexer's families to `registry` (idempotent); `run_indexer` calls it before serving."""
    with _lock:
        if id(registry) in _registered:
            return
        for family in FAMILIES:
            registry.register(family)
        _registered.add(id(registry))


def record_drain(*, indexed: int, updated: int, deleted: int, failed: int, rows: int, seconds: float) -> None:
    """One drain that consumed outbox rows (the `DrainStats` of one `drain_once`)."""
    for op, n in (("index", indexed), ("update", updated), ("delete", deleted)):
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


def refresh_outbox(conn: psycopg.Connection) -> None:
    """Read the outbox gauges: one count over search_outbox (`conn` has the projection schema on its path)."""
    depth, pending = conn.execute(
        "SELECT count(*), count(DISTINCT version_id) FILTER (WHERE op = 'upsert') FROM search_outbox"
    ).fetchone()
    OUTBOX_DEPTH.set(depth)
    VECTORS_PENDING.set(pending)

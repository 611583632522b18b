"""The embedding stage (`ledger embedder`): vectors for the documents the indexers wrote without them.

Any number of embedders drain `embed_queue`: claim a batch (SKIP LOCKED, so a killed process releases it), embed
what is missing, then lock the versions' rows with SKIP LOCKED, so a row the projection is changing is left for
the next round instead of deadlocking, store the vectors and queue the versions for an indexer again. A version's
text never changes, so a vector computed once is valid for every later state; the document is always rebuilt from
the row's current state.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from elasticsearch import Elasticsearch
from psycopg import sql
from psycopg.rows import dict_row

from producers.metrics import serve as serve_metrics
from producers.settings import Settings
from projections.embedding import Embedder, Embedders, load_embedder
from projections.postgres.connection import search_path
from projections.postgres.counts import EMBED, INDEXER_SHARD, OUTBOX, add_counts
from projections.search import metrics
from projections.search.claims import claim_fairly, delete_claimed, finish
from projections.search.client import es_client
from projections.search.documents import embedding_text_for
from projections.search.drain import EMBED_CHANNEL, OUTBOX_CHANNEL, drain_forever, lower_priority, notify
from projections.search.duplicates import Link, find_links, store_links
from projections.search.vectors import VECTOR_COLUMNS, Vectors, lacking, store_vectors

__all__ = ["EmbedStats", "claim", "complete", "embed_once", "run_embedder"]

log = logging.getLogger("ledger.embedder")


@dataclass
class EmbedStats:
    claimed: int = 0
    stored: int = 0  # versions whose vectors were stored (their documents queued for rewriting)
    complete: int = 0  # versions that already had every configured vector
    gone: int = 0  # versions no longer in PostgreSQL (erased)
    deferred: int = 0  # versions whose rows were locked by the projection: left queued for the next round
    texts: int = 0


def _set_path(conn: psycopg.Connection, settings: Settings) -> None:
    conn.execute(search_path(settings.pg_schema))


def claim(conn: psycopg.Connection, batch_size: int) -> list[dict[str, Any]]:
    """In the caller's transaction: lock up to `batch_size` unclaimed queue rows and read their versions (text
    columns and stored vectors); a version gone from PostgreSQL comes back with `row` None. The batch is shared
    among the tenants waiting (claims.claim_fairly)."""
    queued = claim_fairly(conn, "embed_queue", "id, version_id, tenant", batch_size)
    if not queued:
        return []
    query = sql.SQL(
        "SELECT f.version_id, f.tenant, f.subject, f.kind, f.observed_at, f.content, f.key, f.aliases, {vectors} "
        "FROM fact_versions f WHERE f.version_id = ANY(%s)"
    ).format(vectors=VECTOR_COLUMNS)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, ([vid for _, vid, _ in queued],))
        rows = {r["version_id"]: r for r in cur.fetchall()}
    return [{"version_id": vid, "tenant": tenant, "row": rows.get(vid)} for _, vid, tenant in queued]


def complete(
    settings: Settings,
    conn: psycopg.Connection,
    claimed: list[dict[str, Any]],
    made: dict[str, Vectors],
    links: Sequence[Link] = (),
) -> EmbedStats:
    """In the claim's transaction: store `made` (version id -> its vectors) and the near-duplicate `links` of the
    versions whose rows can be locked now, queue their documents, and remove every finished version from the
    queue."""
    stats = EmbedStats(claimed=len(claimed))
    gone = [c for c in claimed if c["row"] is None]
    ready = [c for c in claimed if c["row"] is not None and not lacking(settings, c["row"])]
    wanted = sorted(vid for vid in made if any(c["version_id"] == vid and c["row"] is not None for c in claimed))
    locked = [
        r[0]
        for r in conn.execute(
            "SELECT version_id FROM fact_versions WHERE version_id = ANY(%s) ORDER BY version_id "
            "FOR NO KEY UPDATE SKIP LOCKED",
            (wanted,),
        )
    ]
    stats.deferred = len(wanted) - len(locked)
    finish(conn, settings)  # the closing statements, serialized with every other indexer's and embedder's
    with conn.cursor() as cur:
        mine = set(locked)
        store_links(cur, [x for x in links if x.version_id in mine])
        stored = store_vectors(cur, [(vid, made[vid]) for vid in locked])
        queued = cur.execute(
            # after new versions' rows (priority 1), at the version's place in the log (api.consistency)
            'INSERT INTO search_outbox (version_id, tenant, subject, op, priority, "partition", "offset") '
            'SELECT version_id, tenant, subject, \'upsert\', 1, "partition", "offset" FROM fact_versions '
            "WHERE version_id = ANY(%s) "
            "RETURNING tenant",
            (stored,),
        ).fetchall()
        if queued:
            notify(conn, OUTBOX_CHANNEL)  # the indexers wake when this commits, to write the vectors
        finished = [c["version_id"] for c in gone + ready] + stored
        removed = delete_claimed(cur, "embed_queue", finished)
    deltas: Counter = Counter()
    for (tenant,) in queued:
        deltas[(tenant, OUTBOX)] += 1
    for tenant in removed:
        deltas[(tenant, EMBED)] -= 1
    add_counts(conn, deltas, shard=INDEXER_SHARD)
    stats.stored, stats.complete, stats.gone = len(stored), len(ready), len(gone)
    return stats


def embed_once(
    settings: Settings,
    conn: psycopg.Connection,
    embedder: Embedder | Embedders,
    *,
    batch_size: int | None = None,
    cache: dict[str, Vectors] | None = None,
    es: Elasticsearch | None = None,
) -> EmbedStats:
    """Claim, embed and complete one batch (one transaction of `conn`, an autocommit connection).

    `cache`: vectors computed for versions that were deferred (their rows locked), or whose near-duplicate look-up
    failed (Elasticsearch away: the batch rolled back), reused on the next round instead of embedded again.
    `es`: where near-duplicate episodes are looked up; None links none."""
    embedders = Embedders.of(settings, embedder)
    batch_size = batch_size or settings.embedder_batch_size
    cache = cache if cache is not None else {}
    _set_path(conn, settings)
    with conn.transaction():
        claimed = claim(conn, batch_size)
        if not claimed:
            return EmbedStats()
        todo = [c for c in claimed if c["row"] is not None and lacking(settings, c["row"])]
        fresh = [c for c in todo if c["version_id"] not in cache]
        made = {c["version_id"]: cache[c["version_id"]] for c in todo if c["version_id"] in cache}
        if fresh:
            started = time.perf_counter()
            vectors = embedders.vectors([embedding_text_for(c["row"]) for c in fresh])
            metrics.embedding(sum(len(v) for v in vectors), time.perf_counter() - started)
            made.update({c["version_id"]: v for c, v in zip(fresh, vectors, strict=True)})
        links: list[Link] = []
        if es is not None:
            fresh_rows = [(c["row"], made[c["version_id"]]) for c in fresh]
            try:
                links = find_links(es, settings.es_index, fresh_rows)
            except Exception:  # Elasticsearch away: the batch rolls back, its vectors wait for the retry
                cache.clear()
                cache.update(made)
                raise
        stats = complete(settings, conn, claimed, made, links)
        stats.texts = sum(len(made[c["version_id"]]) for c in fresh)
    cache.clear()
    if stats.deferred:
        cache.update(made)  # the next round finds those versions again; the rest is stored
    return stats


def run_embedder(
    settings: Settings, *, poll_seconds: float | None = None, batch_size: int | None = None, stop=None
) -> None:
    """Embed forever (until `stop()` returns true) in the one drain loop (projections.search.drain): woken by the
    indexers' queued versions; `poll_seconds` is the longest wait for a notification (LEDGER_EMBEDDER_POLL_S)."""
    poll_seconds = settings.embedder_poll_s if poll_seconds is None else poll_seconds
    batch_size = batch_size or settings.embedder_batch_size
    lower_priority(settings.embedder_nice)  # the semantic stage yields the CPU to the projection and the documents
    embedders = Embedders(settings, load_embedder(settings))
    es = es_client(settings, request_timeout=30)
    metrics.register(families=metrics.EMBEDDER_FAMILIES)
    serve_metrics(settings.embedder_metrics_port, settings.metrics_host, setting="LEDGER_EMBEDDER_METRICS_PORT")
    cache: dict[str, Vectors] = {}
    total, t0 = 0, time.monotonic()
    log.info("embedder: embedding %s.embed_queue with %s", settings.pg_schema, settings.embed_model)

    def once(conn: psycopg.Connection) -> bool:
        nonlocal total
        started = time.perf_counter()
        stats = embed_once(settings, conn, embedders, batch_size=batch_size, cache=cache, es=es)
        finished = stats.stored + stats.complete + stats.gone
        if finished:
            metrics.record_embed(
                stored=stats.stored, complete=stats.complete, gone=stats.gone, seconds=time.perf_counter() - started
            )
            total += finished
            log.info(
                "embedder: %d versions (%d texts; %d total, %.1f versions/s)",
                finished,
                stats.texts,
                total,
                total / (time.monotonic() - t0),
            )
        return stats.claimed >= batch_size  # a full batch: more may wait

    drain_forever(
        settings,
        once,
        channels=(EMBED_CHANNEL,),
        poll_seconds=poll_seconds,
        log=log,
        record_error=metrics.record_embed_error,
        stop=stop,
    )

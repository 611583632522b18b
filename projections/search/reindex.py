"""Reindex: fill a new physical index from PostgreSQL, then switch the alias atomically; and the orphan check.

`ledger reindex`. The reindex holds the indexer's advisory lock, so no batch is drained
while it runs: outbox rows that arrive meanwhile stay queued and are drained into the new
index after the switch (documents are built from current rows, so nothing is lost or
doubled). The orphan check (`orphans`, `/v1/stats` `search`): every version id is in both
stores, so the version ids only in PostgreSQL or only in the index must be none once the
outbox is drained.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from elasticsearch import AsyncElasticsearch, Elasticsearch
from elasticsearch.helpers import streaming_bulk
from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row

from producers.settings import Settings
from projections.embedding import Embedder, Embedders
from projections.languages import EN_FIELD
from projections.search.documents import build_doc, embedding_text_for, rows_sql
from projections.search.ids import doc_ids, doc_ids_async, tenant_query
from projections.search.indexer import lock_key
from projections.search.mapping import create_physical, physical_indices, vector_fields

__all__ = ["orphans", "orphans_async", "reindex"]

Progress = Callable[[int, int], None]  # (done, total)


def _set_path(conn: psycopg.Connection, settings: Settings) -> None:
    conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(settings.pg_schema)))


def reindex(
    settings: Settings,
    conn: psycopg.Connection,
    es: Elasticsearch,
    embedder: Embedder | Embedders,
    *,
    batch_size: int = 256,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Index every fact version into `<alias>-<ts>`, point the alias at it, delete the old index.

    Every version is re-embedded by the configured model of its language (issue 15): switching a model is this."""
    _set_path(conn, settings)
    embedder = Embedders.of(settings, embedder)
    alias = settings.es_index
    t0 = time.monotonic()
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (lock_key(settings),))
    try:
        total = conn.execute("SELECT count(*) FROM fact_versions").fetchone()[0]
        en_dim = vector_fields(settings)[EN_FIELD]["dims"]
        new = create_physical(es, alias, embedder.dim, refresh_interval="-1", en_dim=en_dim)
        done = 0
        try:
            with conn.transaction(), conn.cursor(name="reindex", row_factory=dict_row) as cur:
                cur.itersize = batch_size
                cur.execute(rows_sql(sql.SQL("true")) + sql.SQL(" ORDER BY f.version_id"))
                while rows := cur.fetchmany(batch_size):
                    vectors = embedder.vectors([embedding_text_for(r) for r in rows])
                    actions = [
                        {"_index": new, "_id": r["version_id"], "_source": build_doc(r, None, vectors=v)}
                        for r, v in zip(rows, vectors, strict=True)
                    ]
                    for ok, info in streaming_bulk(es, actions, max_retries=6, initial_backoff=0.5, max_backoff=16):
                        if not ok:  # raise_on_error is on: unreachable, kept for clarity
                            raise RuntimeError(f"reindex: {info}")
                    done += len(rows)
                    if progress:
                        progress(done, total)
            es.indices.put_settings(index=new, settings={"index": {"refresh_interval": "1s"}})
            es.indices.refresh(index=new)
        except BaseException:
            es.indices.delete(index=new, ignore_unavailable=True)
            raise
        old = physical_indices(es, alias)
        actions = [{"remove": {"index": o, "alias": alias}} for o in old]
        actions.append({"add": {"index": new, "alias": alias, "is_write_index": True}})
        es.indices.update_aliases(actions=actions)  # one atomic switch
        for o in old:
            es.indices.delete(index=o, ignore_unavailable=True)
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (lock_key(settings),))
    seconds = time.monotonic() - t0
    return {
        "index": new,
        "replaced": old,
        "documents": done,
        "seconds": round(seconds, 2),
        "docs_per_s": round(done / seconds, 1) if seconds else None,
    }


_PG_IDS = "SELECT version_id FROM fact_versions WHERE (%(t)s::text IS NULL OR tenant = %(t)s)"
_PENDING = "SELECT count(*) FROM search_outbox WHERE (%(t)s::text IS NULL OR tenant = %(t)s)"


def _report(in_pg: set[str], in_es: set[str], pending: int) -> dict[str, Any]:
    missing_in_es, missing_in_pg = sorted(in_pg - in_es), sorted(in_es - in_pg)
    return {
        "missing_in_es": len(missing_in_es),
        "missing_in_pg": len(missing_in_pg),
        "examples": {"missing_in_es": missing_in_es[:5], "missing_in_pg": missing_in_pg[:5]},
        "outbox_pending": pending,  # orphans are only meaningful once this is 0 (caught up)
        "pg_versions": len(in_pg),
        "es_documents": len(in_es),
    }


def orphans(settings: Settings, conn: psycopg.Connection, es: Elasticsearch, tenant: str | None = None) -> dict:
    """Version ids only in PostgreSQL (`missing_in_es`) or only in the index (`missing_in_pg`)."""
    _set_path(conn, settings)
    in_pg = {r[0] for r in conn.execute(_PG_IDS, {"t": tenant})}
    pending = conn.execute(_PENDING, {"t": tenant}).fetchone()[0]
    return _report(in_pg, doc_ids(es, settings.es_index, tenant_query(tenant)), pending)


async def orphans_async(
    settings: Settings, conn: AsyncConnection, es: AsyncElasticsearch, tenant: str | None = None
) -> dict:
    """`orphans` for the API (its pool's connections already have the schema on the search_path)."""
    async with conn.cursor() as cur:
        await cur.execute(_PG_IDS, {"t": tenant})
        in_pg = {r[0] for r in await cur.fetchall()}
        await cur.execute(_PENDING, {"t": tenant})
        pending = (await cur.fetchone())[0]
    return _report(in_pg, await doc_ids_async(es, settings.es_index, tenant_query(tenant)), pending)

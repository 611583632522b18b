"""Reindex: fill a new physical index from PostgreSQL, then switch the alias atomically; and the orphan check.

`ledger reindex`. The reindex holds the reindex lock exclusively (projections.search.claims): the indexers'
batches in flight finish first, and new ones wait (skip) while it runs, so outbox rows that arrive meanwhile stay
queued and are drained into the new index after the switch (documents are built from current rows, so nothing
is lost or doubled). Embedders keep running: they write PostgreSQL only. Each document is written with its
version's stored vectors and revision, so a reindex embeds nothing unless a model changed; a version without a
stored vector of a configured model is embedded now (and stored), or queued for the embedders with `embedder`
None. The orphan check (`orphans`, `/v1/stats` `search`): every version id is in both stores, so the version ids
only in PostgreSQL or only in the index must be none once the outbox is drained.
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
from projections import shapes
from projections.embedding import Embedder, Embedders
from projections.languages import EN_FIELD
from projections.models import model_spec
from projections.postgres.connection import search_path
from projections.postgres.counts import INDEXER_SHARD, add_counts
from projections.search.claims import finish, release_reindex, take_reindex
from projections.search.documents import embedding_text_for, rows_sql
from projections.search.ids import doc_ids, doc_ids_async, tenant_query
from projections.search.indexer import DOC_EXTRA, doc_action
from projections.search.mapping import create_physical, physical_indices, vector_fields
from projections.search.vectors import lacking, pack, queue_for_vectors, store_vectors

__all__ = ["orphans", "orphans_async", "reindex"]

Progress = Callable[[int, int], None]  # (done, total)


def _fill_missing(
    settings: Settings, writer: psycopg.Connection, rows: list[dict[str, Any]], embedder: Embedders | None
) -> int:
    """Give `rows` lacking a configured vector their vectors (stored, new revisions), or queue them; how many."""
    todo = [r for r in rows if lacking(settings, r)]
    if not todo:
        return 0
    with writer.transaction():
        if embedder is None:
            finish(writer, settings)
            add_counts(
                writer,
                queue_for_vectors(writer, [(r["version_id"], r["tenant"], None) for r in todo]),
                shard=INDEXER_SHARD,
            )
            return len(todo)
        made = embedder.vectors([embedding_text_for(r) for r in todo])
        locked = {
            v
            for (v,) in writer.execute(
                "SELECT version_id FROM fact_versions WHERE version_id = ANY(%s) ORDER BY version_id FOR NO KEY UPDATE",
                ([r["version_id"] for r in todo],),
            )
        }
        with writer.cursor() as cur:
            store_vectors(
                cur, [(r["version_id"], v) for r, v in zip(todo, made, strict=True) if r["version_id"] in locked]
            )
            revs = dict(
                cur.execute(
                    "SELECT version_id, rev FROM fact_versions WHERE version_id = ANY(%s)", (sorted(locked),)
                ).fetchall()
            )
    for r, v in zip(todo, made, strict=True):  # the document of this reindex carries them, at the new revision
        if r["version_id"] in revs:
            by_field = {f: (m, vec) for f, m, vec in v}
            r["vec_fields"] = sorted(by_field)
            r["vec_models"] = [by_field[f][0] for f in r["vec_fields"]]
            r["vec_data"] = [pack(by_field[f][1]) for f in r["vec_fields"]]
            r["rev"] = revs[r["version_id"]]
    return len(todo)


def reindex(
    settings: Settings,
    conn: psycopg.Connection,
    es: Elasticsearch,
    embedder: Embedder | Embedders | None = None,
    *,
    batch_size: int = 256,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Index every fact version into `<alias>-<ts>`, point the alias at it, delete the old index.

    Stored vectors are reused; a version without one of the configured models (a switched model) is
    embedded by `embedder` now, or queued for the embedders when it is None."""
    conn.execute(search_path(settings.pg_schema))
    embedders = None if embedder is None else Embedders.of(settings, embedder)
    alias = settings.es_index
    t0 = time.monotonic()
    take_reindex(conn, settings)
    writer = psycopg.connect(settings.pg_dsn, autocommit=True)  # vectors are stored batch by batch, not in the scan
    writer.execute(search_path(settings.pg_schema))
    embedded = 0
    try:
        total = conn.execute("SELECT count(*) FROM fact_versions").fetchone()[0]
        en_dim = vector_fields(settings)[EN_FIELD]["dims"]
        new = create_physical(
            es,
            alias,
            model_spec(settings.embed_model).dim,
            replicas=settings.es_replicas,
            refresh_interval="-1",
            en_dim=en_dim,
        )
        done = 0
        try:
            query = rows_sql(sql.SQL("true"), extra=DOC_EXTRA) + sql.SQL(" ORDER BY f.version_id")
            with conn.transaction(), conn.cursor(name="reindex", row_factory=dict_row) as cur:
                cur.itersize = batch_size
                cur.execute(query)
                while rows := cur.fetchmany(batch_size):
                    embedded += _fill_missing(settings, writer, rows, embedders)
                    actions = [doc_action(settings, new, r) for r in rows]
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
        writer.close()
        release_reindex(conn, settings)
    seconds = time.monotonic() - t0
    return {
        "index": new,
        "replaced": old,
        "documents": done,
        "embedded": embedded if embedders is not None else 0,
        "queued": embedded if embedders is None else 0,
        "seconds": round(seconds, 2),
        "docs_per_s": round(done / seconds, 1) if seconds else None,
    }


_PG_IDS = "SELECT version_id FROM fact_versions WHERE (%(t)s::text IS NULL OR tenant = %(t)s)"
_PENDING = "SELECT count(*) FROM search_outbox WHERE (%(t)s::text IS NULL OR tenant = %(t)s)"


def _report(in_pg: set[str], in_es: set[str], pending: int) -> shapes.SearchOrphans:
    missing_in_es, missing_in_pg = sorted(in_pg - in_es), sorted(in_es - in_pg)
    return {
        "missing_in_es": len(missing_in_es),
        "missing_in_pg": len(missing_in_pg),
        "examples": {"missing_in_es": missing_in_es[:5], "missing_in_pg": missing_in_pg[:5]},
        "outbox_pending": pending,  # orphans are only meaningful once this is 0 (caught up)
        "pg_versions": len(in_pg),
        "es_documents": len(in_es),
    }


def orphans(
    settings: Settings, conn: psycopg.Connection, es: Elasticsearch, tenant: str | None = None
) -> shapes.SearchOrphans:
    """Version ids only in PostgreSQL (`missing_in_es`) or only in the index (`missing_in_pg`)."""
    conn.execute(search_path(settings.pg_schema))
    in_pg = {r[0] for r in conn.execute(_PG_IDS, {"t": tenant})}
    pending = conn.execute(_PENDING, {"t": tenant}).fetchone()[0]
    return _report(in_pg, doc_ids(es, settings.es_index, tenant_query(tenant)), pending)


async def orphans_async(
    settings: Settings, conn: AsyncConnection, es: AsyncElasticsearch, tenant: str | None = None
) -> shapes.SearchOrphans:
    """`orphans` for the API (its pool's connections already have the schema on the search_path)."""
    async with conn.cursor() as cur:
        await cur.execute(_PG_IDS, {"t": tenant})
        in_pg = {r[0] for r in await cur.fetchall()}
        await cur.execute(_PENDING, {"t": tenant})
        pending = (await cur.fetchone())[0]
    return _report(in_pg, await doc_ids_async(es, settings.es_index, tenant_query(tenant)), pending)

"""`GET /v1/stats?tenant=`: counters and bounded checks, in milliseconds; `GET /v1/stats/consistency?tenant=`: the full
check, which scans everything and says what it scanned and how long it took.

/v1/stats reads counters the writers keep in their own transactions and bounded index lookups, asking the three
stores in parallel; a new part is one more `_..._part` function. The full check takes seconds at scale, so
api.limits bounds it and a call meanwhile gets 429 `busy`. A store that fails is a 503 naming it, never a partial
body whose zeros would read as "healthy".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import psycopg
from elasticsearch import AsyncElasticsearch, NotFoundError
from fastapi import APIRouter, Response

from api.deps import EsDep, PoolDep, ResourcesDep, SettingsDep, TenantQuery, TenantsDep, check_tenant
from api.errors import store_unavailable
from api.limits import CONSISTENCY_SLOTS
from api.routes._json import json_response
from api.schemas import ConsistencyResponse, StatsResponse
from producers.settings import Settings
from producers.topics import EndOffsetReader
from projections import shapes
from projections.postgres.positions import stored_positions_async
from projections.postgres.queries import access_summary
from projections.postgres.stats import recount_check, stats_counts
from projections.search.ids import tenant_query

router = APIRouter(tags=["stats"])

T = TypeVar("T")


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)


async def _timed(work: Awaitable[T]) -> tuple[T, float]:
    t0 = time.perf_counter()
    return await work, _ms(t0)


async def _kafka_ends(offsets: EndOffsetReader) -> dict[int, int]:
    try:
        return await asyncio.to_thread(offsets.read)
    except Exception as exc:  # noqa: BLE001 - any failure to read the offsets is kafka's
        raise store_unavailable("kafka", exc) from exc


async def _es_documents(es: AsyncElasticsearch, index: str, tenant: str) -> int:
    """The tenant's documents in the index (an index that does not exist yet has none)."""
    try:
        return int((await es.count(index=index, query=tenant_query(tenant)))["count"])
    except NotFoundError:
        return 0


async def _postgres_part(conn: psycopg.AsyncConnection, settings: Settings, tenant: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    counts = await stats_counts(conn, tenant, settings.topic)
    positions = await stored_positions_async(conn, settings.processor_group, settings.topic)
    return {"counts": counts, "positions": positions, "ms": _ms(t0)}


def _lag_part(settings: Settings, ends: dict[int, int], positions: dict[int, int]) -> dict[str, Any]:
    lag: dict[str, shapes.PartitionLag] = {}
    for p in sorted(set(ends) | set(positions)):
        end, pos = ends.get(p), positions.get(p, 0)
        lag[str(p)] = {"end_offset": end, "position": pos, "lag": None if end is None else max(end - pos, 0)}
    return {
        "consumer": settings.processor_group,
        "topic": settings.topic,
        "lag": lag,
        "total_lag": sum(v["lag"] or 0 for v in lag.values()),
    }


def _settle(*tasks: asyncio.Future) -> None:
    """Cancel what is still running; retrieve what failed, so a failure behind another one is not logged as lost."""
    for task in tasks:
        if not task.done():
            task.cancel()
        elif not task.cancelled():
            task.exception()


@router.get("/stats", response_model=StatsResponse)
async def stats(
    settings: SettingsDep, res: ResourcesDep, pool: PoolDep, es: EsDep, tenant: TenantQuery, tenants: TenantsDep
) -> Response:
    check_tenant(tenant, tenants)
    t0 = time.perf_counter()
    # in parallel: the slowest store bounds the wait
    ends_task = asyncio.ensure_future(_timed(_kafka_ends(res.offsets)))
    docs_task = asyncio.ensure_future(_timed(_es_documents(es, settings.es_index, tenant)))
    try:
        async with pool.connection() as conn:
            pg = await _postgres_part(conn, settings, tenant)
            access, access_ms = await _timed(access_summary(conn, tenant))  # never-retrieved, most served
        ends, kafka_ms = await ends_task
        es_documents, es_ms = await docs_task
    finally:
        _settle(ends_task, docs_task)
    counts = dict(pg["counts"])
    lag = counts.pop("search_lag")
    body: shapes.StatsResponse = {
        "tenant": tenant,
        **counts,
        **_lag_part(settings, ends, pg["positions"]),
        "search": {
            "pg_versions": counts["versions"],
            "es_documents": es_documents,
            **lag,
        },
        "access": access,
        "took_ms": {
            "postgres": pg["ms"],
            "access": access_ms,
            "elasticsearch": es_ms,
            "kafka": kafka_ms,
            "total": _ms(t0),
        },
    }
    return json_response(body)


@router.get("/stats/consistency", response_model=ConsistencyResponse)
async def consistency(
    settings: SettingsDep, pool: PoolDep, es: EsDep, tenant: TenantQuery, tenants: TenantsDep
) -> Response:
    check_tenant(tenant, tenants)
    from projections.search.reindex import orphans_async

    t0 = time.perf_counter()
    async with CONSISTENCY_SLOTS.try_slot(tenant), pool.connection() as conn:  # one scan per tenant, few in all
        pg = await recount_check(conn, tenant, settings.topic)
        t1 = time.perf_counter()
        search = await orphans_async(settings, conn, es, tenant)
        search_ms = _ms(t1)
    drained = search["outbox_pending"] == 0
    orphans = search["missing_in_es"] + search["missing_in_pg"]
    body: shapes.ConsistencyResponse = {
        "tenant": tenant,
        "consistent": not any(pg["invariants"].values()) and not pg["counter_drift"] and not (drained and orphans),
        "invariants": pg["invariants"],
        "counters": pg["counters"],
        "counter_drift": pg["counter_drift"],
        "search": search,
        "scanned": {
            "postgres_rows": {**pg["rows_scanned"], "version_ids": search["pg_versions"]},
            "elasticsearch_documents": search["es_documents"],
        },
        "took_ms": {"postgres": pg["ms"], "search": search_ms, "total": _ms(t0)},
    }
    return json_response(body)

"""`GET /v1/stats?tenant=`: invariant counters (all 0 when healthy), counts, consumer lag per partition.

Lag = the topic's end offset (Kafka, via kafka-python) minus the position stored in PostgreSQL
for the projector's consumer group; `dlq_count` counts dead letters of the whole topic (an
invalid record has no trustworthy tenant). `search` compares PostgreSQL's versions with the
index's documents (invariant 4).

Every number here needs all three stores: if one fails the answer is a prompt 503 naming it
(`store_unavailable`), never a partial body whose zeros would read as "healthy". `/v1/health`
says which parts are up.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response

from api.deps import EsDep, PoolDep, SettingsDep, TenantQuery, TenantsDep, check_tenant
from api.errors import store_unavailable
from api.routes._json import json_response
from api.schemas import StatsResponse
from producers.settings import Settings
from producers.topics import end_offsets
from projections.postgres.positions import stored_positions_async
from projections.postgres.queries import invariant_counts

router = APIRouter(tags=["stats"])


async def _kafka_ends(settings: Settings) -> dict[int, int]:
    try:
        return await asyncio.to_thread(end_offsets, settings, timeout_s=settings.api_kafka_timeout_s)
    except Exception as exc:  # noqa: BLE001 - any failure to read the offsets is kafka's
        raise store_unavailable("kafka", exc) from exc


@router.get("/stats", response_model=StatsResponse)
async def stats(settings: SettingsDep, pool: PoolDep, es: EsDep, tenant: TenantQuery, tenants: TenantsDep) -> Response:
    check_tenant(tenant, tenants)
    from projections.search.reindex import orphans_async

    ends_task = asyncio.ensure_future(_kafka_ends(settings))  # in parallel: the slowest store bounds the wait
    try:
        async with pool.connection() as conn:
            counts = await invariant_counts(conn, tenant)
            positions = await stored_positions_async(conn, settings.processor_group, settings.topic)
            # invariant 4: version ids only in PostgreSQL or only in Elasticsearch (meaningful once outbox_pending is 0)
            search = await orphans_async(settings, conn, es, tenant)
        ends = await ends_task
    finally:
        if not ends_task.done():
            ends_task.cancel()
        elif not ends_task.cancelled():
            ends_task.exception()  # retrieved, so a kafka failure behind a postgres one is not logged as lost
    lag: dict[str, dict[str, int | None]] = {}
    for p in sorted(set(ends) | set(positions)):
        end, pos = ends.get(p), positions.get(p, 0)
        lag[str(p)] = {"end_offset": end, "position": pos, "lag": None if end is None else max(end - pos, 0)}
    body = {
        "tenant": tenant,
        **counts,
        "consumer": settings.processor_group,
        "topic": settings.topic,
        "lag": lag,
        "total_lag": sum(v["lag"] or 0 for v in lag.values()),
        "search": search,
    }
    return json_response(body)

"""`GET /v1/stats?tenant=`: invariant counters (all 0 when healthy), counts, consumer lag per partition.

Lag = the topic's end offset (Kafka, via kafka-python) minus the position stored in PostgreSQL
for the projector's consumer group; `dlq_count` counts dead letters of the whole topic (an
invalid record has no trustworthy tenant).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from api.deps import SettingsDep, TenantsDep, check_tenant
from api.routes._json import json_response
from infra.settings import Settings
from projections.postgres.queries import invariant_counts, stored_positions

router = APIRouter(tags=["stats"])


def _end_offsets(settings: Settings) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False, request_timeout_ms=5000
    )
    try:
        parts = consumer.partitions_for_topic(settings.topic) or set()
        tps = [TopicPartition(settings.topic, p) for p in sorted(parts)]
        return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()} if tps else {}
    finally:
        consumer.close()


@router.get("/stats")
async def stats(
    request: Request,
    settings: SettingsDep,
    tenant: Annotated[str, Query(min_length=1, max_length=128)],
    tenants: TenantsDep,
) -> Response:
    check_tenant(tenant, tenants)
    async with request.app.state.pg.connection() as conn:
        counts = await invariant_counts(conn, tenant)
        positions = await stored_positions(conn, settings.processor_group, settings.topic)
    lag: dict[str, dict[str, int | None]] = {}
    kafka_error = None
    try:
        ends = await run_in_threadpool(_end_offsets, settings)
    except Exception as exc:  # noqa: BLE001 - the counters are still worth answering
        ends, kafka_error = {}, f"{type(exc).__name__}: {exc}"[:300]
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
    }
    # invariant 4: version ids only in PostgreSQL or only in Elasticsearch (meaningful once outbox_pending is 0)
    from projections.search.rebuild import orphans_async

    try:
        async with request.app.state.pg.connection() as conn:
            body["search"] = await orphans_async(settings, conn, request.app.state.es, tenant)
    except Exception as exc:  # noqa: BLE001 - the other counters are still worth answering
        body["search"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if kafka_error:
        body["kafka_error"] = kafka_error
    return json_response(body)

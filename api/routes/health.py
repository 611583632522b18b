"""`GET /v1/health`: is each part of the stack reachable right now, and Elasticsearch not red? (no API key needed)

200 `{"status": "ok", "parts": {...}}`, or 503 `degraded` with the same parts plus `detail` in the
one error shape (a `store_unavailable` item naming each store that is down). The broker's answer
is reused for a second (`Resources.kafka_probe`).
"""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Response

from api.deps import ResourcesDep
from api.errors import store_unavailable
from api.resources import Resources
from api.routes._json import json_response
from api.schemas import HealthResponse
from producers.topics import probe as kafka_probe
from projections import shapes

router = APIRouter(tags=["health"])


async def _timed(coro) -> shapes.HealthPart:
    t0 = time.perf_counter()
    try:
        detail = await asyncio.wait_for(coro, timeout=3)
        return {"ok": True, "ms": round((time.perf_counter() - t0) * 1000, 2), **(detail or {})}
    except Exception as exc:  # noqa: BLE001 - any failure is reported, not raised
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


async def _pg(res: Resources) -> dict:
    async with res.pool.connection(timeout=2) as conn:
        await conn.execute("SELECT 1")
    return {}


async def _es(res: Resources) -> dict:
    health = await res.es.cluster.health(timeout="2s")
    # a primary shard unassigned: searches and writes may fail. The cluster's status, as infra judges it: the
    # ledger's alias may not exist yet (the indexer makes it), and a red index of another user counts too
    if health["status"] == "red":
        raise ConnectionError(f"the cluster is red: {health['unassigned_shards']} shards unassigned")
    return {"status": health["status"]}


async def _kafka(res: Resources) -> dict:
    settings = res.settings
    ok, age = await res.kafka_probe.ok(lambda: kafka_probe(settings, 2.5))
    if not ok:
        raise ConnectionError(f"no broker answers a metadata request at {settings.kafka_bootstrap}")
    return {"age_s": round(age, 3)}


@router.get("/health", response_model=HealthResponse)
async def health(res: ResourcesDep) -> Response:
    parts = dict(
        zip(
            ("postgres", "elasticsearch", "kafka"),
            await asyncio.gather(_timed(_pg(res)), _timed(_es(res)), _timed(_kafka(res))),
            strict=True,
        )
    )
    ok = all(p["ok"] for p in parts.values())
    body: shapes.HealthResponse = {"status": "ok" if ok else "degraded", "parts": parts}
    if not ok:  # the one error shape too: one store_unavailable item per part that is down
        body["detail"] = [store_unavailable(name, p["error"]).item() for name, p in parts.items() if not p["ok"]]
    return json_response(body, 200 if ok else 503)

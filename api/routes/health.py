"""`GET /v1/health`: is each part of the stack reachable right now? (no API key needed)

200 `{"status": "ok", "parts": {...}}`, or 503 `degraded` with the same parts plus `detail` in the
one error shape (a `store_unavailable` item naming each store that is down).
"""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request, Response

from api.deps import SettingsDep
from api.errors import store_unavailable
from producers.topics import probe as kafka_probe

router = APIRouter(tags=["health"])


async def _timed(coro) -> dict:
    t0 = time.perf_counter()
    try:
        detail = await asyncio.wait_for(coro, timeout=3)
        return {"ok": True, "ms": round((time.perf_counter() - t0) * 1000, 2), **(detail or {})}
    except Exception as exc:  # noqa: BLE001 - any failure is reported, not raised
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


async def _pg(request: Request) -> dict:
    async with request.app.state.pg.connection(timeout=2) as conn:
        await conn.execute("SELECT 1")
    return {}


async def _es(request: Request) -> dict:
    health = await request.app.state.es.cluster.health(timeout="2s")
    return {"status": health["status"]}


class _KafkaProbe:
    """The broker's last answer, reused for `ttl` seconds, with at most one probe in flight.

    Each probe builds a kafka-python admin client: 10-130 ms idle and several hundred under CPU
    load, which made /v1/health slow exactly when an operator needs it. A 1 s old answer is
    still news: an outage shows within a second.
    """

    def __init__(self, ttl: float = 1.0) -> None:
        self.ttl = ttl
        self._answer: tuple[float, bool] | None = None
        self._task: asyncio.Future[bool] | None = None

    async def ok(self, bootstrap: str) -> tuple[bool, float]:
        now = time.monotonic()
        if self._answer is not None and now - self._answer[0] < self.ttl:
            return self._answer[1], now - self._answer[0]
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(asyncio.to_thread(kafka_probe, bootstrap, 2.5))
        ok = await asyncio.shield(self._task)
        self._answer = (time.monotonic(), ok)
        return ok, 0.0


async def _kafka(request: Request, settings) -> dict:
    cache = getattr(request.app.state, "kafka_probe", None)
    if cache is None:
        cache = request.app.state.kafka_probe = _KafkaProbe()
    ok, age = await cache.ok(settings.kafka_bootstrap)
    if not ok:
        raise ConnectionError(f"no broker answers a metadata request at {settings.kafka_bootstrap}")
    return {"age_s": round(age, 3)}


@router.get("/health")
async def health(request: Request, settings: SettingsDep, response: Response) -> dict:
    parts = dict(
        zip(
            ("postgres", "elasticsearch", "kafka"),
            await asyncio.gather(_timed(_pg(request)), _timed(_es(request)), _timed(_kafka(request, settings))),
            strict=True,
        )
    )
    ok = all(p["ok"] for p in parts.values())
    response.status_code = 200 if ok else 503
    body: dict = {"status": "ok" if ok else "degraded", "parts": parts}
    if not ok:  # the one error shape too: one store_unavailable item per part that is down
        body["detail"] = [store_unavailable(name, p["error"]).item() for name, p in parts.items() if not p["ok"]]
    return body

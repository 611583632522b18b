"""Client-side latency over HTTP: recall per stage (the `mode` parameter) and audit replay.

Measured from the client (httpx, one keep-alive connection, one request at a time), so the
numbers include the HTTP round trip, JSON and the FastAPI stack, like an agent sees them. The
server's own per-stage timings (`trace.stages_ms`) are kept beside them to say where time goes.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson

from bench.dataset import questions_for

__all__ = ["audit_latency", "per_item_us", "percentiles", "recall_latency", "recall_queries"]


def percentiles(ms: list[float]) -> dict[str, float | int | None]:
    """p50/p90/p99/max/mean of a list of milliseconds (nearest-rank percentiles)."""
    if not ms:
        return {"n": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    s = sorted(ms)

    def rank(p: float) -> float:
        return round(s[min(len(s) - 1, max(0, int(-(-p * len(s) // 100)) - 1))], 3)

    return {
        "n": len(s),
        "p50_ms": rank(50),
        "p90_ms": rank(90),
        "p99_ms": rank(99),
        "max_ms": round(s[-1], 3),
        "mean_ms": round(statistics.fmean(s), 3),
    }


def recall_queries(events: list[dict], tenant: str, n: int, seed: int = 5) -> list[str]:
    """n real questions (bench.dataset phrasings, Chinese and English) about facts the events assert."""
    r = random.Random(seed)
    facts = sorted(
        {
            (e["key"], e["entities"][0])
            for e in events
            if e.get("key") and e.get("entities") and e.get("tenant") == tenant
        }
    )
    out: list[str] = []
    while len(out) < n and facts:
        key, entity = r.choice(facts)
        out.append(r.choice(questions_for(key, entity)))
    return out


def recall_latency(
    url: str, api_key: str, tenant: str, queries: list[str], modes: tuple[str, ...], warmup: int = 20
) -> dict[str, Any]:
    """For each mode: client p50/p99 over the queries, hit/empty counts and the server's median stage times."""
    out: dict[str, Any] = {}
    headers = {"X-API-Key": api_key, "Content-Type": "application/json"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for mode in modes:
            for q in queries[:warmup]:
                client.post("/v1/recall", content=orjson.dumps({"tenant": tenant, "query": q, "mode": mode}))
            ms: list[float] = []
            server: list[float] = []  # a request's stage times summed: the server's own time (sections do not nest)
            stages: dict[str, list[float]] = defaultdict(list)
            hits = empty = 0
            for q in queries:
                body = orjson.dumps({"tenant": tenant, "query": q, "mode": mode, "top_k": 5})
                t0 = time.perf_counter()
                r = client.post("/v1/recall", content=body)
                ms.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 200:
                    raise RuntimeError(f"recall {mode} {r.status_code}: {r.text[:300]}")
                res = orjson.loads(r.content)
                hits += bool(res["hits"])
                empty += not res["hits"]
                took = res.get("trace", {}).get("stages_ms") or {}
                for name, v in took.items():
                    stages[name].append(v)
                server.append(sum(took.values()))
            out[mode] = {
                **percentiles(ms),
                "server_ms": percentiles(server),
                "with_hits": hits,
                "empty": empty,
                "server_stage_median_ms": {k: round(statistics.median(v), 3) for k, v in sorted(stages.items())},
            }
    return out


def audit_latency(url: str, api_key: str, tenant: str, subject: str, repeats: int = 50) -> dict[str, Any]:
    """GET /v1/subjects/{subject}/events: the whole audit trail of one subject, client-side."""
    ms: list[float] = []
    n_events = 0
    with httpx.Client(base_url=url, headers={"X-API-Key": api_key}, timeout=60) as client:
        path = f"/v1/subjects/{subject}/events"
        for i in range(repeats + 3):
            t0 = time.perf_counter()
            r = client.get(path, params={"tenant": tenant})
            dt = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                raise RuntimeError(f"GET {path} {r.status_code}: {r.text[:300]}")
            if i >= 3:  # warm-up
                ms.append(dt)
            n_events = len(orjson.loads(r.content)["events"])
    return {"subject": subject, "events": n_events, **percentiles(ms)}


def per_item_us(fn: Callable[[Any], Any], items: Sequence[Any], repeat: int = 5) -> float:
    """Microseconds per item of `fn(item)`: the best of `repeat` passes over `items` (timeit's rule)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - t0)
    return round(best / len(items) * 1e6, 2)

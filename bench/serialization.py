"""`python -m bench.serialization`: what serializing a read's answer costs, as the routes do it and through models.

The routes answer with orjson over the dicts the read paths build (api.routes._json.json_response); the other way
is to return the body and let FastAPI validate it into the route's response model (api.schemas) and serialize
that (pydantic, `response_model_exclude_unset` so that absent fields stay absent). Both are measured on the same
answers:

1. World: `--facts` versions of one subject (a tenth of them superseded once) straight through the worker's
   Recorder into a private schema, indexed by the indexer's `drain_once` (no vectors: the recall asked is exact).
2. Serve: the API as a uvicorn subprocess on the private settings, through `bench.serialization:bench_app`, which is
   `api.main.create_app()` plus `/bench/recall` and `/bench/facts/{subject}`: the same read functions
   (api.reads.recall, api.reads.subject_facts), answered through FastAPI's response-model path instead.
3. In process: the real answers of POST /v1/recall (`--hits` exact hits) and GET /v1/subjects/{s}/facts (every
   fact) serialized `--reps` times by `json_response` and by FastAPI's `serialize_response` with the route's own
   response field; median microseconds per answer, and whether both give the same bytes.
4. Over HTTP: one keep-alive client, one request at a time, the two ways interleaved round by round (`--rounds` of
   `--requests` each); the median of the rounds' p50s.

`--root` serves another source tree (a copy of the repository before a change) with the same world. The machine is
shared: run it more than once and compare medians. Drops the private schema, index and topics at the end.
"""

# no `from __future__ import annotations`: bench_app's routes annotate with names FastAPI resolves at runtime
import asyncio
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import typer

__all__ = ["bench_app", "main"]

TENANT, KEY, SUBJECT = "shapes", "k-shapes", "project:bench"
RECALL = {"tenant": TENANT, "query": "backend setting bench"}


def bench_app():
    """The API plus the two read routes answered through FastAPI's response-model path (the way not taken)."""
    from api import reads, schemas
    from api.deps import ResourcesDep, TenantQuery, TenantsDep
    from api.main import create_app
    from api.requests import RecallBody

    app = create_app()

    @app.post("/bench/recall", response_model=schemas.RecallResponse, response_model_exclude_unset=True)
    async def bench_recall(body: RecallBody, res: ResourcesDep, tenants: TenantsDep) -> Any:
        return await reads.recall(res, tenants, body)

    @app.get("/bench/facts/{subject:path}", response_model=schemas.FactsResponse, response_model_exclude_unset=True)
    async def bench_facts(subject: str, res: ResourcesDep, tenant: TenantQuery, tenants: TenantsDep) -> Any:
        return await reads.subject_facts(res, tenants, tenant, subject)

    return app


def _world(settings, facts: int) -> None:
    """`facts` versions of SUBJECT through the Recorder, every tenth superseded once, then indexed (no vectors)."""
    import psycopg
    from elasticsearch import Elasticsearch

    from producers.contract import EventType, MemoryEvent, Source, SourceType, encode
    from producers.records import decode_record
    from producers.topics import ensure_topics
    from projections.postgres.recorder import Recorder, connect
    from projections.postgres.schema import create_schema
    from projections.search.indexer import drain_once

    ensure_topics(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    t0 = datetime(2026, 1, 5, 9, 0, 0, 123456, tzinfo=UTC)
    events = []
    for i in range(facts):
        value: Any = {"port": 8000 + i, "host": f"h{i}.example"} if i % 3 == 0 else f"value-{i}"
        for again in (0, 1) if i % 10 == 0 else (0,):
            events.append(
                MemoryEvent(
                    type=EventType.ASSERTED,
                    tenant=TENANT,
                    subject=SUBJECT,
                    key=f"project.setting_{i:03d}",
                    value=value if not again else i + 1,
                    content=f"project bench backend setting {i} is {'now' if again else 'value'} {i + again}",
                    aliases=[f"setting {i}", "backend setting"],
                    entities=["bench", f"E{i}"],
                    tags=["bench"],
                    source=Source(type=SourceType.EXPLICIT, service="bench"),
                    valid_from=t0 + timedelta(days=again, minutes=i),
                    observed_at=t0 + timedelta(days=again, minutes=i),
                )
            )
    now_ms = int(time.time() * 1000)
    records = [decode_record(settings.topic, 0, n, encode(e), timestamp_ms=now_ms) for n, e in enumerate(events)]
    with connect(settings.pg_dsn, settings.pg_schema) as conn:
        Recorder(conn, consumer=settings.processor_group, topic=settings.topic).apply_batch(records)
        conn.commit()
    es = Elasticsearch(settings.es_url, request_timeout=120)
    try:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            while drain_once(settings, conn, es, batch_size=2000):
                pass
        es.indices.refresh(index=settings.es_index)
    finally:
        es.close()


def _micro(recall: dict[str, Any], facts: dict[str, Any], reps: int) -> dict[str, dict[str, Any]]:
    """Median microseconds per answer: the routes' json_response against FastAPI's response-model path."""
    from fastapi.routing import serialize_response

    from api.main import create_app
    from api.routes._json import json_response

    def routes(rs: Any) -> Any:  # the app's routes, through FastAPI's included routers
        for r in rs:
            candidates = getattr(r, "effective_candidates", None)
            yield from routes(candidates()) if callable(candidates) else (r,)

    fields = {r.path: r.response_field for r in routes(create_app().router.routes) if hasattr(r, "response_field")}
    loop = asyncio.new_event_loop()

    def timed(work: Any, n: int = 200) -> float:
        runs = []
        for _ in range(reps):
            t = time.perf_counter()
            for _ in range(n):
                work()
            runs.append((time.perf_counter() - t) / n * 1e6)
        return round(statistics.median(runs), 1)

    out = {}
    for name, body, path in (
        ("recall", recall, "/v1/recall"),
        ("facts", facts, "/v1/subjects/{subject:path}/facts"),
    ):
        field = fields[path]

        def models(body: Any = body, field: Any = field) -> bytes:
            return loop.run_until_complete(
                serialize_response(field=field, response_content=body, exclude_unset=True, dump_json=True)
            )

        out[name] = {
            "json_response_us": timed(lambda body=body: json_response(body)),
            "models_us": timed(models),
            "same_bytes": models() == json_response(body).body,
        }
    loop.close()
    return out


def _http(url: str, rounds: int, requests: int, hits: int) -> dict[str, dict[str, Any]]:
    """Per way, the median over rounds of each round's p50 (ms); the ways interleaved round by round."""
    asks = {
        "recall": lambda c, p: c.post(p, json={**RECALL, "top_k": hits}),
        "facts": lambda c, p: c.get(p, params={"tenant": TENANT}),
    }
    paths = {
        ("recall", "json_response"): "/v1/recall",
        ("recall", "models"): "/bench/recall",
        ("facts", "json_response"): f"/v1/subjects/{SUBJECT}/facts",
        ("facts", "models"): f"/bench/facts/{SUBJECT}",
    }
    p50s: dict[tuple[str, str], list[float]] = {k: [] for k in paths}
    with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=30) as c:
        for (read, _), path in paths.items():  # warm every route
            for _ in range(10):
                asks[read](c, path).raise_for_status()
        for _ in range(rounds):
            for (read, way), path in paths.items():
                ms = []
                for _ in range(requests):
                    t = time.perf_counter()
                    r = asks[read](c, path)
                    ms.append((time.perf_counter() - t) * 1000)
                    r.raise_for_status()
                p50s[(read, way)].append(statistics.median(ms))
    return {
        f"{read} {way}": {"p50_ms": round(statistics.median(v), 2), "rounds": [round(x, 2) for x in v]}
        for (read, way), v in p50s.items()
    }


def main(
    facts: int = typer.Option(100, help="fact versions in force of the subject (GET .../facts answers all)"),
    hits: int = typer.Option(20, help="top_k of the recall (every fact matches exactly)"),
    reps: int = typer.Option(7, help="in-process repetitions (median)"),
    rounds: int = typer.Option(5, help="HTTP rounds (median of the rounds' p50s)"),
    requests: int = typer.Option(100, help="HTTP requests per way and round"),
    root: Path | None = typer.Option(None, help="serve this source tree (default: this repository)"),
) -> None:
    """Serialization of a recall (`--hits` hits) and a facts answer (`--facts` facts): in process and over HTTP."""
    from infra.private import drop_private, free_port
    from infra.procs import launch, terminate
    from producers.settings import REPO_ROOT, get_settings

    port = free_port()
    settings = get_settings().private(f"bench_ser_{uuid.uuid4().hex[:8]}", api_keys={KEY: [TENANT]}, api_port=port)
    src = root or REPO_ROOT
    log = REPO_ROOT / ".data" / "logs" / f"bench-serialization-{port}.log"
    api = None
    try:
        _world(settings, facts)
        env = {**settings.child_environ(), "PYTHONPATH": str(src), "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "uvicorn", "bench.serialization:bench_app", "--factory", "--port", str(port)]
        api = launch([*cmd, "--log-level", "warning", "--no-access-log"], log, env, src)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            if api.poll() is not None:
                raise RuntimeError(f"the API exited; log: {log}")
            try:
                if httpx.get(url + "/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the API is not up; log: {log}")
            time.sleep(0.3)
        with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=30) as c:
            recall = orjson.loads(c.post("/v1/recall", json={**RECALL, "top_k": hits}).content)
            answer = orjson.loads(c.get(f"/v1/subjects/{SUBJECT}/facts", params={"tenant": TENANT}).content)
        if len(recall["hits"]) != hits or len(answer["facts"]) != facts:
            raise RuntimeError(f"asked {hits} hits, {facts} facts: got {len(recall['hits'])}, {len(answer['facts'])}")
        result = {"micro": _micro(recall, answer, reps), "http": _http(url, rounds, requests, hits)}
        typer.echo(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    finally:
        if api is not None:
            terminate(api, 20, group=True)
        drop_private(settings)


if __name__ == "__main__":
    typer.run(main)

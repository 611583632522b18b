"""`python -m bench stats`: how long `/v1/stats` and `/v1/stats/consistency` take at 100k facts, over HTTP.

1. Load: a bench.dataset stream (assertions, updates, retractions, confirmations) of one tenant, enough events for
   `--facts` fact versions, straight through the worker's Recorder (projections.postgres.recorder, batches of
   2,000, Kafka-like partitions and offsets) into a private schema: the rows and the counters the worker would
   write, without publishing 100k records through Kafka one by one.
   Then accesses: `--served` of the facts (a deterministic draw) get 1 to 5 accesses each through the worker's
   AccessProjector (projections.postgres.access_projector, batches of 2,000), so `/v1/stats` `access` counts
   served facts and `most_served` walks a realistic access_counts.
2. Index: the indexer's own `drain_once` empties the outbox into a private index. No embedder runs: neither stats
   call reads a vector, and embedding 100k texts would cost many minutes of CPU that measure nothing here.
3. Serve: the API as a uvicorn subprocess on the private settings, through `bench.stats:bench_app`, which is
   `api.main.create_app()` plus `GET /bench/stats-before`: the stats route as it was before the counters (every
   version id of PostgreSQL and Elasticsearch scanned per request, `invariant_counts`' full scans), with the
   same access summary the route has today, so before/after differ only by the change.
4. Measure: one keep-alive client, one request at a time; p50/p99 per route (bench.latency.percentiles), the
   server's own `took_ms` for /v1/stats, and before/after = p50(before) / p50(/v1/stats).
5. In process, on one connection: the counters against the old scans, and the access summary (counters and the
   index-ordered most_served) against the one before it (`_SERVED_BEFORE`: every version of the tenant that
   holds now, left-joined to access_counts) and against a walk of access_counts probing each served fact
   (`_SERVED_BOUNDED`, the bounded option: the numerator only, the denominator would still be the scan).

Writes bench/results/stats-<UTC>.json and .md (the API's log: .data/logs/bench-stats-<UTC>/); drops the private
schema, index and topics unless `--keep`.
CPU heavy at 100k (the load and the index take minutes on 2 cores): run it once.
"""

# no `from __future__ import annotations`: bench_app's route annotates with names it imports (FastAPI resolves them)
import asyncio
import math
import platform
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import orjson
import typer

__all__ = ["bench_app", "stats_command"]

TENANT = "bench"
KEY = "k-bench"
BATCH = 2000

# the access summary's count before the counters: every fact of the tenant with a version holding now
_SERVED_BEFORE = """
WITH cur AS (SELECT DISTINCT f.memory_id FROM fact_versions f
             WHERE f.tenant = %(tenant)s AND f.valid_from <= %(now)s
               AND (LEAST(f.valid_to, f.superseded_at) IS NULL OR %(now)s < LEAST(f.valid_to, f.superseded_at)))
SELECT count(*), count(a.memory_id), coalesce(sum(a.accesses), 0)
FROM cur LEFT JOIN access_counts a ON a.tenant = %(tenant)s AND a.memory_id = cur.memory_id
"""
# option (b): walk access_counts, one index probe of fact_versions per served fact (the numerator only)
_SERVED_BOUNDED = """
SELECT count(*), coalesce(sum(a.accesses), 0) FROM access_counts a
WHERE a.tenant = %(tenant)s AND EXISTS (SELECT 1 FROM fact_versions f WHERE f.memory_id = a.memory_id
  AND f.tenant = a.tenant AND f.valid_from <= %(now)s
  AND (LEAST(f.valid_to, f.superseded_at) IS NULL OR %(now)s < LEAST(f.valid_to, f.superseded_at)))
"""


def _bench_api(settings, log_dir: Path):
    """bench.services.Services whose "api" is `bench_app` (bench.services is imported only when the bench runs)."""
    from bench.services import Services

    class BenchApi(Services):
        def _cmd(self, name: str) -> list[str]:
            if name != "api":
                return super()._cmd(name)
            host, port = self.settings.api_host, str(self.settings.api_port)
            return [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.stats:bench_app",
                "--factory",
                "--host",
                host,
                "--port",
                port,
            ]

    return BenchApi(settings, log_dir)


def bench_app():
    """`uvicorn --factory bench.stats:bench_app`: the real app plus the stats route as it was before the counters."""
    from fastapi import Query, Request, Response

    from api.main import create_app
    from api.routes._json import json_response
    from api.routes.stats import _lag_part, _settle
    from producers.topics import end_offsets
    from projections.postgres.positions import stored_positions_async
    from projections.postgres.queries import access_summary, invariant_counts
    from projections.search.reindex import orphans_async

    app = create_app()

    @app.get("/bench/stats-before", include_in_schema=False)
    async def stats_before(request: Request, tenant: str = Query(min_length=1)) -> Response:
        settings, res = request.app.state.settings, request.app.state.resources
        # as before: a new consumer per request (the route now keeps one, Resources.offsets)
        ends_task = asyncio.ensure_future(
            asyncio.to_thread(end_offsets, settings, timeout_s=settings.api_kafka_timeout_s)
        )
        try:
            async with res.pool.connection() as conn:
                counts = await invariant_counts(conn, tenant)
                positions = await stored_positions_async(conn, settings.processor_group, settings.topic)
                search = await orphans_async(settings, conn, res.es, tenant)
                access = await access_summary(conn, tenant)
            ends = await ends_task
        finally:
            _settle(ends_task)
        return json_response(
            {"tenant": tenant, **counts, **_lag_part(settings, ends, positions), "search": search, "access": access}
        )

    return app


def _events_for(facts: int, seed: int) -> list[dict]:
    """Enough bench.dataset events (one tenant) for `facts` assertions, i.e. fact versions."""
    from bench.dataset import generate

    n = facts
    while True:
        events = list(generate(n, max(1, n // 10), seed=seed, tenants=(TENANT,)))
        asserted = sum(e["type"] == "memory.asserted" for e in events)
        if asserted >= facts:
            return events
        n = math.ceil(n * facts / max(asserted, 1)) + 10


def load(settings, facts: int, seed: int) -> dict[str, Any]:
    """The dataset through the Recorder (the worker's writer) into the private schema; rows and seconds."""
    from producers.contract import encode, from_dict
    from producers.records import decode_record
    from projections.postgres.recorder import Recorder, connect

    events = _events_for(facts, seed)
    t0 = time.perf_counter()
    offsets = [0] * settings.topic_partitions
    records = []
    now_ms = int(time.time() * 1000)
    for data in events:
        e = from_dict(data)
        p = zlib.crc32(e.kafka_key) % settings.topic_partitions  # a stable spread, like the producer's key hash
        records.append(decode_record(settings.topic, p, offsets[p], encode(e), key=e.kafka_key, timestamp_ms=now_ms))
        offsets[p] += 1
    applied = 0
    with connect(settings.pg_dsn, settings.pg_schema) as conn:
        recorder = Recorder(conn, consumer=settings.processor_group, topic=settings.topic)
        for i in range(0, len(records), BATCH):
            applied += recorder.apply_batch(records[i : i + BATCH]).applied
        versions = conn.execute("SELECT count(*) FROM fact_versions").fetchone()[0]
        conn.commit()
    return {"events": len(events), "applied": applied, "versions": versions, "seconds": time.perf_counter() - t0}


def serve(settings, share: float, seed: int) -> dict[str, Any]:
    """`share` of the loaded facts get 1..5 accesses each, through the access projector the worker runs."""
    import random
    from datetime import UTC, datetime, timedelta

    from producers.contract import AccessEvent, access_id_for, encode_access
    from projections.postgres.access_projector import AccessProjector, decode_access_record
    from projections.postgres.recorder import connect

    r = random.Random(seed)
    t0 = time.perf_counter()
    with connect(settings.pg_dsn, settings.pg_schema) as conn:
        facts = conn.execute(
            "SELECT DISTINCT ON (memory_id) memory_id, version_id FROM fact_versions WHERE tenant = %s "
            "ORDER BY memory_id, version DESC",
            (TENANT,),
        ).fetchall()
        conn.commit()
        chosen = [f for f in facts if r.random() < share]
        at = datetime.now(UTC) - timedelta(days=1)
        records, offset = [], 0
        for i, (memory_id, version_id) in enumerate(chosen):
            for j in range(r.randint(1, 5)):
                a = AccessEvent(
                    access_id=access_id_for(TENANT, "key:bench", f"serving-{i}-{j}", memory_id, version_id),
                    tenant=TENANT,
                    memory_id=memory_id,
                    version_id=version_id,
                    stage="keyword",
                    caller="key:bench",
                    accessed_at=at + timedelta(seconds=i + j),
                )
                records.append(decode_access_record(settings.access_topic, 0, offset, encode_access(a)))
                offset += 1
        projector = AccessProjector(conn, consumer=settings.processor_group, topic=settings.access_topic)
        applied = 0
        for k in range(0, len(records), BATCH):
            applied += projector.apply_batch(records[k : k + BATCH]).applied
    return {"facts": len(facts), "served": len(chosen), "accesses": applied, "seconds": time.perf_counter() - t0}


def index(settings) -> dict[str, Any]:
    """Drain the outbox into the private index with the indexer's own code (documents without vectors)."""
    import psycopg
    from elasticsearch import Elasticsearch

    from projections.search.indexer import drain_once

    t0 = time.perf_counter()
    rows = 0
    es = Elasticsearch(settings.es_url, request_timeout=120)
    try:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            while n := drain_once(settings, conn, es, batch_size=2000):
                rows += n
        es.indices.refresh(index=settings.es_index)
        docs = es.count(index=settings.es_index)["count"]
    finally:
        es.close()
    return {"outbox_rows": rows, "documents": docs, "seconds": time.perf_counter() - t0}


def _time(client, path: str, n: int, warmup: int) -> tuple[list[float], list[dict]]:
    ms, bodies = [], []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        r = client.get(path, params={"tenant": TENANT})
        dt = (time.perf_counter() - t0) * 1000
        if r.status_code != 200:
            raise RuntimeError(f"GET {path} {r.status_code}: {r.text[:300]}")
        if i >= warmup:
            ms.append(dt)
            bodies.append(orjson.loads(r.content))
    return ms, bodies


def measure(url: str, stats_n: int, scan_n: int) -> dict[str, Any]:
    import httpx

    from bench.latency import percentiles

    with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=600) as client:
        after, bodies = _time(client, "/v1/stats", stats_n, warmup=10)
        consistency, checks = _time(client, "/v1/stats/consistency", scan_n, warmup=1)
        before, olds = _time(client, "/bench/stats-before", scan_n, warmup=1)
    parts = {k: round(statistics.median(b["took_ms"][k] for b in bodies), 2) for k in bodies[0]["took_ms"]}
    last = checks[-1]
    same = all(bodies[-1][k] == olds[-1][k] for k in ("events_applied", "versions", "dlq_count", "double_active"))
    return {
        "stats": {**percentiles(after), "server_took_ms_median": parts},
        "consistency": {
            **percentiles(consistency),
            "consistent": last["consistent"],
            "scanned": last["scanned"],
            "server_took_ms": last["took_ms"],
        },
        "stats_before": percentiles(before),
        "before_after_p50": round(percentiles(before)["p50_ms"] / percentiles(after)["p50_ms"], 1),
        "before_after_p99": round(percentiles(before)["p99_ms"] / percentiles(after)["p99_ms"], 1),
        "same_counts_before_and_after": same,
        "counts": {k: bodies[-1][k] for k in ("events_applied", "versions", "dlq_count", "search_pending")},
        "es_documents": bodies[-1]["search"]["es_documents"],
    }


def measure_in_process(settings, fast_n: int, slow_n: int) -> dict[str, Any]:
    """The changed parts alone (no HTTP, no Kafka), on one connection and one client: the counters and the ES count
    against the old scans (invariant_counts, every version id of both stores); the access summary against the one
    before the access counters and against option (b)."""
    from datetime import UTC, datetime

    from elasticsearch import AsyncElasticsearch

    from api.routes.stats import _es_documents
    from bench.latency import percentiles
    from projections.postgres.connection import connect_async
    from projections.postgres.queries import _MOST_SERVED, access_summary, invariant_counts
    from projections.postgres.stats import stats_counts
    from projections.search.reindex import orphans_async

    async def run() -> dict[str, Any]:
        es = AsyncElasticsearch(settings.es_url, request_timeout=120)
        conn = await connect_async(settings.pg_dsn, settings.pg_schema, autocommit=True)
        try:

            async def new() -> None:
                await stats_counts(conn, TENANT, settings.topic)
                await _es_documents(es, settings.es_index, TENANT)

            async def old() -> None:
                await invariant_counts(conn, TENANT)
                await orphans_async(settings, conn, es, TENANT)

            async def access_after() -> None:
                await access_summary(conn, TENANT)

            async def access_before() -> None:  # the summary as it was: the holds-now scan, then most_served
                async with conn.transaction():
                    await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    await conn.execute(_SERVED_BEFORE, {"tenant": TENANT, "now": datetime.now(UTC)})
                    await conn.execute(_MOST_SERVED, {"tenant": TENANT, "top": 10})

            async def access_bounded() -> None:
                await conn.execute(_SERVED_BOUNDED, {"tenant": TENANT, "now": datetime.now(UTC)})

            out = {}
            for name, work, n in (
                ("counters", new, fast_n),
                ("scans_before", old, slow_n),
                ("access_summary", access_after, fast_n),
                ("access_summary_before", access_before, slow_n * 3),
                ("access_bounded_served_only", access_bounded, slow_n * 3),
            ):
                await work()  # warm-up
                ms = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    await work()
                    ms.append((time.perf_counter() - t0) * 1000)
                out[name] = percentiles(ms)
            out["before_after_p50"] = round(out["scans_before"]["p50_ms"] / out["counters"]["p50_ms"], 1)
            out["access_before_after_p50"] = round(
                out["access_summary_before"]["p50_ms"] / out["access_summary"]["p50_ms"], 1
            )
            cur = await conn.execute(_SERVED_BEFORE, {"tenant": TENANT, "now": datetime.now(UTC)})
            out["holds_now_before"] = dict(
                zip(("facts", "served", "accesses"), map(int, await cur.fetchone()), strict=True)
            )
            out["access_after_body"] = {
                k: v for k, v in (await access_summary(conn, TENANT)).items() if k != "most_served"
            }
            return out
        finally:
            await conn.close()
            await es.close()

    return asyncio.run(run())


def _markdown(result: dict[str, Any]) -> str:
    m = result["measured"]
    rows = [
        ("GET /v1/stats", m["stats"]),
        ("GET /v1/stats/consistency", m["consistency"]),
        ("stats before the counters (/bench/stats-before)", m["stats_before"]),
    ]
    lines = [
        f"# /v1/stats at {result['load']['versions']:,} fact versions ({result['started']})",
        "",
        f"Machine: {result['machine']}. Load: {result['load']['events']:,} events through the Recorder in "
        f"{result['load']['seconds']:.1f}s; {result['index']['documents']:,} documents indexed in "
        f"{result['index']['seconds']:.1f}s (without vectors). One client, one request at a time, over HTTP.",
        "",
        "| route | n | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|",
        *[f"| {name} | {p['n']} | {p['p50_ms']} | {p['p90_ms']} | {p['p99_ms']} | {p['max_ms']} |" for name, p in rows],
        "",
        f"before/after: p50 x{m['before_after_p50']}, p99 x{m['before_after_p99']}; same counts: "
        f"{m['same_counts_before_and_after']}.",
        f"/v1/stats server time, median ms per part: {m['stats']['server_took_ms_median']}.",
        f"/v1/stats/consistency scanned {m['consistency']['scanned']} in {m['consistency']['server_took_ms']} ms; "
        f"consistent: {m['consistency']['consistent']}.",
        "",
        "The changed parts alone, in process (PostgreSQL + Elasticsearch, no HTTP, no Kafka; access_summary_before "
        "= the holds-now scan + most_served, access_bounded_served_only = option (b)'s numerator alone):",
        "",
        "| work | n | p50 ms | p99 ms |",
        "|---|---|---|---|",
        *[
            f"| {name} | {p['n']} | {p['p50_ms']} | {p['p99_ms']} |"
            for name, p in ((k, v) for k, v in result["in_process"].items() if isinstance(v, dict) and "p50_ms" in v)
        ],
        "",
        f"before/after: p50 x{result['in_process']['before_after_p50']} (counters); access summary p50 "
        f"x{result['in_process']['access_before_after_p50']}.",
        "",
        f"Accesses: {result['served']['served']:,} of {result['served']['facts']:,} facts served, "
        f"{result['served']['accesses']:,} accesses through the AccessProjector in {result['served']['seconds']:.1f}s. "
        f"Before (versions holding now): {result['in_process']['holds_now_before']}; after (active facts, "
        f"counters): {result['in_process']['access_after_body']}.",
        "",
    ]
    return "\n".join(lines)


def stats_command(
    facts: int = typer.Option(100_000, help="fact versions to load"),
    requests: int = typer.Option(200, help="timed GET /v1/stats requests"),
    scans: int = typer.Option(10, help="timed requests of the scanning routes (consistency, stats before)"),
    seed: int = typer.Option(7, help="dataset seed"),
    served: float = typer.Option(0.2, help="share of the facts that get accesses (1 to 5 each)"),
    keep: bool = typer.Option(False, help="keep the private schema, index and topics"),
    out_dir: Path | None = typer.Option(None, help="results folder (default bench/results)"),
) -> None:
    """Load `facts` fact versions, then time /v1/stats, /v1/stats/consistency and the stats route before counters."""
    from bench.services import drop_private, free_port
    from producers.settings import REPO_ROOT, get_settings
    from producers.topics import ensure_topics
    from projections.postgres.schema import create_schema

    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = get_settings()
    settings = base.private(f"benchstats_{started.lower()}", api_port=free_port(), api_keys={KEY: [TENANT]})
    out = out_dir or REPO_ROOT / "bench" / "results"
    result: dict[str, Any] = {
        "started": started,
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "facts": facts,
    }
    try:
        import psycopg

        ensure_topics(settings)  # the stats route reads the topic's end offsets (empty here: no lag)
        with psycopg.connect(settings.pg_dsn) as conn:
            create_schema(conn, settings.pg_schema)
        result["load"] = load(settings, facts, seed)
        typer.echo(f"loaded {result['load']}")
        result["served"] = serve(settings, served, seed)
        typer.echo(f"served {result['served']}")
        result["index"] = index(settings)
        typer.echo(f"indexed {result['index']}")
        with _bench_api(settings, settings.log_dir / f"bench-stats-{started}") as services:  # .data: git-ignored
            services.start("api")
            time.sleep(10)  # the API loads the embedding model in the background; let it finish first
            result["measured"] = measure(services.url, requests, scans)
        result["in_process"] = measure_in_process(settings, requests, scans)
    finally:
        if not keep:
            drop_private(settings)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"stats-{started}.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (out / f"stats-{started}.md").write_text(_markdown(result))
    typer.echo(_markdown(result))

"""`python -m bench curve`: how the cost grows as the work grows, measured at checkpoints of one growing ledger.

On private names (topic, schema, index; dropped afterwards unless --keep) the worker, indexer, embedder and API run
as subprocesses (bench.services); the dataset is published through the SDK (bench.loader) in segments that end at
the checkpoints (default 10k, 100k, 1M events). Segment k is `bench.dataset.generate(n_k, n_k // 10, seed + k)` with
its clock after the previous one: later segments bring new subjects and updates of earlier ones, so every prefix has
the dataset's mix (a single generate() call would assert each subject once before any update). At each checkpoint:

- ingest rate per stage over the segment, from its first publish: produced (SDK, acks=all), visible in PostgreSQL,
  exact/keyword-queryable (one document per version), vectors stored (every version embedded);
- CPU per item of each process (user + system, /proc): worker per event (until PostgreSQL caught up), indexer per
  document (until every document was written; the vectors' rewrites after that apart), embedder per version
  embedded, API per recall request;
- recall latency over HTTP per mode (bench.latency, like `python -m bench run`);
- bytes on disk: PostgreSQL (pg_total_relation_size of the schema's tables, the work queues apart) and
  Elasticsearch (primary store, its _stats) per fact version; the mean encoded event (what Kafka stores per event
  before its own overhead and compression);
- RSS of each process (psutil, children included).

Embedding runs on the same two cores at ~1/5 of the projector's rate, so vectors are capped (--vectors-up-to,
events): up to the cap each checkpoint waits for every vector; past it the embedder is stopped, later documents
have none, and semantic recall searches only the vectors stored by then (the results say so per point).

Writes bench/results/curve-<UTC>.json and its plot (curve-<UTC>.png).
"""

from __future__ import annotations

import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any

import typer

__all__ = ["curve_command", "run_curve"]

PUBLISH_CHUNK = 20_000  # events generated and published at a time (the dataset is never held whole)
MODES = ("exact", "keyword", "semantic")
QUEUES = ("embed_queue", "search_outbox")  # work queues: drained when caught up, not a cost per fact version


def _cpu(svc: Any) -> dict[str, float]:
    from bench.machine import cpu_seconds

    return {name: cpu_seconds(p.pid) for name, p in svc.procs.items()}


def _rss_mb(svc: Any) -> dict[str, float]:
    """Resident memory of each process we started, its children included (MB)."""
    import psutil

    out = {}
    for name, p in svc.procs.items():
        try:
            proc = psutil.Process(p.pid)
            rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
        except psutil.Error:
            continue
        out[name] = round(rss / 2**20, 1)
    return out


def _pg_bytes(probe: Any) -> dict[str, int]:
    """pg_total_relation_size (heap, indexes, TOAST) of each table of the private schema."""
    rows = probe.pg.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'm') ORDER BY 2 DESC",
        (probe.s.pg_schema,),
    ).fetchall()
    return {name: int(size) for name, size in rows}


def _es_bytes(probe: Any) -> dict[str, int]:
    """Primary store size and document count of the index behind the alias, after a refresh."""
    es = probe.es
    es.indices.refresh(index=probe.s.es_index)
    stats = es.indices.stats(index=probe.s.es_index, metric="store,docs")["_all"]["primaries"]
    return {"store_bytes": int(stats["store"]["size_in_bytes"]), "docs": probe.es_docs()}


def _kafka_bytes(settings: Any) -> int:
    """The ledger topic's log on the brokers' disks, every replica counted (the brokers' DescribeLogDirs)."""
    from kafka import KafkaAdminClient

    from producers.kafka_producer import kafka_connection

    admin = KafkaAdminClient(**kafka_connection(settings))
    try:
        brokers = admin.describe_log_dirs()
    finally:
        admin.close()
    return sum(
        part["partition_size"]
        for broker in brokers
        for log_dir in broker["log_dirs"]
        for topic in log_dir["topics"]
        if topic["name"] == settings.topic
        for part in topic["partitions"]
    )


def _with_vectors(p: Any) -> int:
    return max(p.versions - p.embed_pending - p.outbox, 0)


def _segment(size: int, prev: int, k: int, seed: int, tenant: str):
    from bench.dataset import generate

    n = size - prev
    start = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=37 * prev)  # generate()'s step, after the last
    return generate(n, max(1, n // 10), seed=seed + k, tenants=(tenant,), start=start)


def _recall(svc: Any, queries: list[str], api_key: str, tenant: str) -> dict[str, Any]:
    """Each mode over HTTP (bench.latency) and the API's CPU per request (the warm-up requests counted too)."""
    from bench.latency import recall_latency
    from bench.machine import cpu_seconds

    out = {}
    pid = svc.procs["api"].pid
    for mode in MODES:
        c0 = cpu_seconds(pid)
        r = recall_latency(svc.url, api_key, tenant, queries, (mode,))[mode]
        requests = r["n"] + min(20, len(queries))
        out[mode] = {**r, "api_cpu_ms_per_request": round((cpu_seconds(pid) - c0) / requests * 1000, 2)}
    return out


def run_curve(
    sizes: list[int],
    *,
    vectors_up_to: int,
    queries: int,
    seed: int,
    keep: bool,
    notes: list[str],
    out_dir: Path,
    timeout: float = 3600.0,
) -> Path:
    from rich.console import Console

    from bench.catchup import Probe
    from bench.machine import code_version, load_average, machine_info
    from bench.run import private_settings, recorded
    from bench.services import Services
    from producers.settings import get_settings

    console = Console()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    s = private_settings(get_settings(), f"curve_{stamp}")
    res: dict[str, Any] = {
        "stamp": stamp,
        "started_at": datetime.now(UTC).isoformat(),
        "command": "python -m bench curve " + " ".join(sys.argv[2:]),
        "config": {"sizes": sizes, "vectors_up_to": vectors_up_to, "queries": queries, "seed": seed},
        "names": {"topic": s.topic, "pg_schema": s.pg_schema, "es_index": s.es_index},
        "machine": machine_info(s),
        "code": code_version(),
        "load_average_start": load_average(),
        "notes": notes,
        "points": [],
    }
    console.print(f"[bold]bench curve[/] {stamp}: checkpoints {sizes} events -> {s.pg_schema}")
    svc = Services(s, s.log_dir / f"bench-curve-{stamp}")
    path = out_dir / f"curve-{stamp}.json"
    with recorded(res, path, s, svc, keep=keep, console=console, what="curve"):
        svc.start("worker", "indexer", "embedder", "api")
        probe = Probe(s)
        try:
            _checkpoints(
                s,
                svc,
                probe,
                sizes,
                res,
                console,
                vectors_up_to=vectors_up_to,
                queries=queries,
                seed=seed,
                timeout=timeout,
            )
        finally:
            probe.close()
    if res["points"]:
        plot(res, path.with_suffix(".png"))
    console.print(markdown_table(res))
    console.print(f"results: {path}")
    return path


def _checkpoints(
    s: Any,
    svc: Any,
    probe: Any,
    sizes: list[int],
    res: dict[str, Any],
    console: Any,
    *,
    vectors_up_to: int,
    queries: int,
    seed: int,
    timeout: float,
) -> None:
    """Publish segment after segment; at each checkpoint record into res["points"] (the module docstring)."""
    from bench.catchup import CaughtUpCpu, wait_caught_up
    from bench.latency import recall_queries
    from bench.loader import publish_events
    from bench.machine import load_average
    from bench.run import API_KEY, TENANT, _progress, _warmup
    from producers.contract import encode, from_dict
    from producers.sdk import LedgerProducer

    with console.status("warming up worker, indexer, embedder and API"):
        _warmup(s, svc, probe)
    producer = LedgerProducer(s)
    facts: set[tuple[str, str]] = set()
    encoded = [0, 0]  # bytes, events (a sample of each chunk)
    prev = 0
    t_run = time.perf_counter()
    with _progress(console) as bar:
        t_pub = bar.add_task("publish (SDK)", total=sizes[-1], rate="")
        t_pg = bar.add_task("visible in PostgreSQL", total=sizes[-1], rate="")
        t_es = bar.add_task("indexed in Elasticsearch", total=None, rate="")
        t_vec = bar.add_task("with vectors (semantic)", total=None, rate="")
        base = probe.progress()

        def show(p: Any) -> None:
            el = max(time.perf_counter() - t_run, 1e-6)
            applied = p.applied - base.applied
            bar.update(t_pg, completed=applied, rate=f"{applied / el:,.0f}/s")
            docs = p.es_docs - base.es_docs
            bar.update(t_es, completed=docs, total=p.versions - base.versions or None, rate=f"{docs / el:,.0f}/s")
            vec = _with_vectors(p) - _with_vectors(base)
            bar.update(t_vec, completed=vec, total=p.versions - base.versions or None)

        for k, size in enumerate(sizes):
            embedding = size <= vectors_up_to
            if not embedding and "embedder" in svc.procs:
                svc.stop("embedder")  # the cap: this segment and later ones are indexed without vectors
            before = probe.progress()
            cpu0 = _cpu(svc)
            t0 = time.perf_counter()
            segment = _segment(size, prev, k, seed, TENANT)
            while chunk := list(islice(segment, PUBLISH_CHUNK)):
                facts.update((e["key"], e["entities"][0]) for e in chunk if e.get("key") and e.get("entities"))
                for e in chunk[:200]:
                    encoded[0] += len(encode(from_dict(e)))
                    encoded[1] += 1

                def on_chunk(n: int) -> None:
                    bar.update(t_pub, advance=n)
                    show(probe.progress())

                publish_events(s, chunk, producer=producer, on_chunk=on_chunk)
            publish_s = time.perf_counter() - t0
            caught = CaughtUpCpu({name: proc.pid for name, proc in svc.procs.items()})

            def progress(p: Any, caught: CaughtUpCpu = caught) -> None:
                show(p)
                caught(p)

            pg_s, es_s, vec_s = wait_caught_up(
                probe,
                timeout=timeout,
                on_progress=progress,
                alive=svc.check_alive,
                interval=0.2,
                semantic=embedding,
                documents=True,
            )
            cpu1 = _cpu(svc)
            after = probe.progress()
            n, docs = size - prev, after.es_docs - before.es_docs
            embedded = _with_vectors(after) - _with_vectors(before)
            cpu = {name: cpu1[name] - cpu0.get(name, cpu1[name]) for name in cpu1}
            for name, at in caught.at.items():
                cpu[name] = at - cpu0.get(name, at)
            idle_s = {name: round(cpu1[name] - at, 2) for name, at in caught.at.items()}
            point: dict[str, Any] = {
                "events": size,
                "segment_events": n,
                "fact_versions": after.versions,
                "es_documents": after.es_docs,
                "versions_with_vectors": _with_vectors(after),
                "vectors_complete": embedding,
                "load_average": load_average(),
                "seconds": {
                    "publish": round(publish_s, 2),
                    "pg_visible": round(publish_s + pg_s, 2),
                    "es_queryable": round(publish_s + es_s, 2),
                    **({"vectors_stored": round(publish_s + vec_s, 2)} if embedding else {}),
                },
                "rates": {
                    "produced_events_per_s": round(n / publish_s, 1),
                    "pg_visible_events_per_s": round(n / (publish_s + pg_s), 1),
                    "es_queryable_events_per_s": round(n / (publish_s + es_s), 1),
                    **({"vectors_versions_per_s": round(embedded / (publish_s + vec_s), 1)} if embedding else {}),
                },
                "cpu_s": {name: round(v, 2) for name, v in cpu.items()},
                "cpu_s_after_caught_up": idle_s,  # the worker's and indexer's, while later stages caught up
                "cpu_per_item_us": {
                    "worker_per_event": round(cpu["worker"] / n * 1e6, 1),
                    "indexer_per_document": round(cpu["indexer"] / max(docs, 1) * 1e6, 1),
                    **(
                        {"embedder_per_version": round(cpu["embedder"] / max(embedded, 1) * 1e6, 1)}
                        if embedding
                        else {}
                    ),
                },
            }
            bar.stop()
            with console.status(f"storage and recall at {size:,} events"):
                pg = _pg_bytes(probe)
                steady = sum(v for name, v in pg.items() if name not in QUEUES)
                es = _es_bytes(probe)
                point["storage"] = {
                    "pg_tables_bytes": pg,
                    "pg_bytes": steady,
                    "pg_queue_bytes": sum(v for name, v in pg.items() if name in QUEUES),
                    "pg_bytes_per_version": round(steady / max(after.versions, 1), 1),
                    "pg_bytes_per_event": round(steady / max(size, 1), 1),
                    # the vectors' own table, per version that has them (past the cap most have none)
                    "pg_vector_bytes_per_embedded_version": round(
                        pg.get("version_vectors", 0) / max(_with_vectors(after), 1), 1
                    ),
                    "pg_bytes_per_version_without_vectors": round(
                        (steady - pg.get("version_vectors", 0)) / max(after.versions, 1), 1
                    ),
                    "es_store_bytes": es["store_bytes"],
                    "es_bytes_per_document": round(es["store_bytes"] / max(es["docs"], 1), 1),
                    "kafka_encoded_bytes_per_event": round(encoded[0] / max(encoded[1], 1), 1),
                    # on disk: the encoded event, the record's framing and its batch's share, no compression
                    "kafka_log_bytes_per_event": round(_kafka_bytes(s) / max(after.total, 1), 1),
                }
                point["rss_mb"] = _rss_mb(svc)
                fake = [{"key": key, "entities": [ent], "tenant": TENANT} for key, ent in sorted(facts)]
                point["recall"] = _recall(svc, recall_queries(fake, TENANT, queries), API_KEY, TENANT)
                point["rss_mb_after_recall"] = _rss_mb(svc)
            bar.start()
            res["points"].append(point)
            r, c, st = point["rates"], point["cpu_per_item_us"], point["storage"]
            console.print(
                f"  {size:,} events ({after.versions:,} versions): produced {r['produced_events_per_s']:,.0f}/s, "
                f"PG {r['pg_visible_events_per_s']:,.0f}/s, ES {r['es_queryable_events_per_s']:,.0f}/s"
                + (f", vectors {r['vectors_versions_per_s']:,.0f} versions/s" if embedding else "")
                + f"; worker {c['worker_per_event']:.0f} µs/event; PG {st['pg_bytes_per_version']:,.0f} "
                f"B/version, ES {st['es_bytes_per_document']:,.0f} B/doc; exact p50 "
                f"{point['recall']['exact']['p50_ms']} ms; load {point['load_average'][0]}"
            )
            prev = size
    producer.close()
    res["seconds"] = round(time.perf_counter() - t_run, 1)


def markdown_table(res: dict[str, Any]) -> str:
    """One row per checkpoint: the numbers BENCHMARKS.md and docs/deploy.md quote."""
    lines = [
        "| events | fact versions | produced /s | PG-visible /s | exact/keyword-queryable /s | vectors versions/s "
        "| worker µs/event | indexer µs/doc | embedder ms/version | PG B/version | ES B/doc (with vectors) "
        "| exact p50/p99 ms | keyword p50/p99 ms | semantic p50/p99 ms | RSS MB worker/indexer/embedder/API | load |",
        "|" + "---|" * 16,
    ]
    for p in res["points"]:
        r, c, st, rl, rss = p["rates"], p["cpu_per_item_us"], p["storage"], p["recall"], p["rss_mb"]
        vec = f"{r['vectors_versions_per_s']:,.0f}" if "vectors_versions_per_s" in r else "capped"
        emb = f"{c['embedder_per_version'] / 1000:.1f}" if "embedder_per_version" in c else "-"
        share = p["versions_with_vectors"] / max(p["fact_versions"], 1)
        lines.append(
            f"| {p['events']:,} | {p['fact_versions']:,} | {r['produced_events_per_s']:,.0f} "
            f"| {r['pg_visible_events_per_s']:,.0f} | {r['es_queryable_events_per_s']:,.0f} | {vec} "
            f"| {c['worker_per_event']:,.0f} | {c['indexer_per_document']:,.0f} | {emb} "
            f"| {st['pg_bytes_per_version']:,.0f} | {st['es_bytes_per_document']:,.0f} ({share:.0%}) "
            + " ".join(f"| {rl[m]['p50_ms']:.1f} / {rl[m]['p99_ms']:.1f}" for m in MODES)
            + f" | {'/'.join(f'{rss[n]:,.0f}' if n in rss else '-' for n in ('worker', 'indexer', 'embedder', 'api'))} "
            f"| {p['load_average'][0]} |"
        )
    return "\n".join(lines)


def plot(res: dict[str, Any], png: Path) -> None:
    """Each metric against the ledger's size (log x): rates, recall latency, CPU per item, bytes, RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = res["points"]
    x = [p["events"] for p in pts]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))

    def series(ax: Any, label: str, ys: list[Any], **kw: Any) -> None:
        xs = [a for a, b in zip(x, ys, strict=True) if b is not None]
        ax.plot(xs, [b for b in ys if b is not None], marker="o", label=label, **kw)

    ax = axes[0][0]
    for key, label in (
        ("produced_events_per_s", "produced (SDK)"),
        ("pg_visible_events_per_s", "PostgreSQL-visible"),
        ("es_queryable_events_per_s", "exact/keyword-queryable"),
        ("vectors_versions_per_s", "vectors stored (versions/s)"),
    ):
        series(ax, label, [p["rates"].get(key) for p in pts])
    ax.set_title("ingest rate per stage (per segment)")
    ax.set_ylabel("events/s")
    ax.set_yscale("log")
    ax = axes[0][1]
    for mode in MODES:
        line = ax.plot(x, [p["recall"][mode]["p50_ms"] for p in pts], marker="o", label=f"{mode} p50")[0]
        ax.plot(x, [p["recall"][mode]["p99_ms"] for p in pts], marker="x", ls="--", color=line.get_color())
    ax.set_title("recall latency over HTTP (solid p50, dashed p99)")
    ax.set_ylabel("ms")
    ax = axes[0][2]
    series(ax, "worker per event", [p["cpu_per_item_us"]["worker_per_event"] for p in pts])
    series(ax, "indexer per document", [p["cpu_per_item_us"]["indexer_per_document"] for p in pts])
    series(ax, "embedder per version", [p["cpu_per_item_us"].get("embedder_per_version") for p in pts])
    series(ax, "API per exact recall", [p["recall"]["exact"]["api_cpu_ms_per_request"] * 1000 for p in pts])
    ax.set_title("CPU per item")
    ax.set_ylabel("µs (log)")
    ax.set_yscale("log")
    ax = axes[1][0]
    series(ax, "PostgreSQL per fact version", [p["storage"]["pg_bytes_per_version"] for p in pts])
    series(ax, "Elasticsearch per document", [p["storage"]["es_bytes_per_document"] for p in pts])
    series(ax, "Kafka encoded event", [p["storage"]["kafka_encoded_bytes_per_event"] for p in pts])
    series(ax, "Kafka log per event", [p["storage"].get("kafka_log_bytes_per_event") for p in pts])
    ax.set_title("bytes on disk per item")
    ax.set_ylabel("bytes")
    ax = axes[1][1]
    for name in ("worker", "indexer", "embedder", "api"):
        series(ax, name, [p["rss_mb"].get(name) for p in pts])
    ax.set_title("RSS per process")
    ax.set_ylabel("MB")
    ax = axes[1][2]
    series(ax, "fact versions", [p["fact_versions"] for p in pts])
    series(ax, "versions with vectors", [p["versions_with_vectors"] for p in pts])
    ax.set_title("ledger size")
    ax.set_yscale("log")
    for ax in [a for row in axes for a in row]:
        ax.set_xscale("log")
        ax.set_xlabel("events in the ledger")
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=7)
    m = res["machine"]
    fig.suptitle(
        f"{res['started_at'][:19]}Z  {m['cpu_model']}, {m['cores']} cores, {m['ram_gb']} GB; vectors up to "
        f"{res['config']['vectors_up_to']:,} events",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def curve_command(
    sizes: str = typer.Option("10000,100000,1000000", help="comma-separated checkpoints, in events"),
    vectors_up_to: int = typer.Option(100_000, help="embed until this many events; past it the embedder stops"),
    queries: int = typer.Option(200, help="recall queries per mode and checkpoint"),
    seed: int = typer.Option(7, help="dataset seed"),
    keep: bool = typer.Option(False, help="keep the private topic/schema/index afterwards"),
    note: list[str] = typer.Option([], help="a note to record with the results (repeatable)"),
    out_dir: Path | None = typer.Option(None, help="results folder (default bench/results)"),
) -> None:
    """The cost curve: ingest rate per stage, recall latency, CPU per item, bytes per fact version and RSS per
    process at growing sizes of one ledger."""
    from bench.machine import require_extras
    from bench.run import RESULTS

    require_extras("matplotlib", "psutil")
    signal.signal(signal.SIGTERM, _interrupt)  # a stopped run still writes the checkpoints it reached, and cleans up
    points = sorted({int(x) for x in sizes.split(",") if x.strip()})
    if not points or points[0] <= 0:
        raise typer.BadParameter("--sizes: positive event counts")
    path = run_curve(
        points,
        vectors_up_to=vectors_up_to,
        queries=queries,
        seed=seed,
        keep=keep,
        notes=list(note),
        out_dir=out_dir or RESULTS,
    )
    import orjson

    if "error" in orjson.loads(path.read_bytes()):
        raise typer.Exit(1)

"""`python -m bench run`: every number of BENCHMARKS.md, measured in one run on one machine.

Order (each step on private names, so other users of the servers are not disturbed):
 1. generate the dataset (bench.dataset);
 2. raw speed of each component alone on that data (bench.raw): Kafka produce, PostgreSQL
    COPY, fastembed embedding, Elasticsearch bulk with vectors;
 2b. the SDK's publish against raw kafka-python produce of the same events, in alternating rounds
    (bench.publish);
 3. start the worker, the indexer and the API as subprocesses (bench.services), warm them up;
 4. ingest end to end through the SDK, in phases that end at the recall measuring points
    (e.g. 10k facts, then all): each phase is timed from its first publish until PostgreSQL
    (stored positions = end offsets) and Elasticsearch (outbox drained, one doc per version)
    hold it; recall latency per stage over HTTP at each point;
 5. quality (bench.eval: L2 storage, L3 retrieval);
 6. produce -> queryable lag at half the measured ingest rate, or `lag_rate` (bench.lag);
 7. audit replay of a subject with 1k events;
 8. full rebuild from offset 0 (stream_processors.rebuild), services stopped;
 9. read-your-writes: write/read pairs over HTTP and MCP (bench.ryw, its own private services);
10. results JSON + BENCHMARKS.md + plot (bench.report), clean-up.
"""

from __future__ import annotations

import random
import time
import traceback
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.catchup import CaughtUpCpu, Probe, wait_caught_up
from bench.dataset import ATTRIBUTES, generate
from bench.lag import CLIENT_NICE, LOAD_TENANT, PROBE_TENANT, measure_lag_apart, probe_seed_events
from bench.latency import audit_latency, recall_latency, recall_queries
from bench.loader import publish_events
from bench.machine import code_version, load_average, machine_info
from bench.profile import Recording
from bench.services import Services, drop_private, free_port, unique_name
from producers.contract import encode, from_dict, rfc3339
from producers.sdk import LedgerProducer
from producers.settings import REPO_ROOT, Settings, get_settings

__all__ = ["RunConfig", "recorded", "run_bench"]

TENANT = "bench"
AUDIT_TENANT = "bench-audit"
API_KEY = "bench-key"
RESULTS = REPO_ROOT / "bench" / "results"


@dataclass
class RunConfig:
    events: int = 100_000
    subjects: int = 10_000
    seed: int = 7
    raw_embed: int = 4000  # texts embedded by the raw fastembed benchmark
    raw_es: int = 10_000  # documents bulk-indexed by the raw Elasticsearch benchmark
    recall_at: tuple[int, ...] = (10_000,)  # fact versions at which recall latency is measured (and at the end)
    recall_queries: int = 300
    lag_seconds: float = 30.0
    lag_rate: float | None = None  # events/s of the lag step's load; None: half the measured end-to-end rate
    probe_rate: float = 2.0
    audit_events: int = 1000
    eval_sample: int = 200
    keep: bool = False  # keep topic/schema/index afterwards (for `python -m bench eval` against them)
    out_dir: Path = RESULTS
    skip: tuple[str, ...] = ()  # steps to skip: raw, publish, recall, eval, lag, audit, rebuild, ryw
    ryw_pairs: int = 1000  # write/read pairs per door of the read-your-writes step (bench.ryw)
    publish_rounds: int = 3  # alternating raw-produce / SDK-publish rounds of the publish comparison (bench.publish)
    catchup_timeout: float = 3600.0
    profile: bool = False  # py-spy the indexer and worker during the last ingest phase, the API under exact recall
    workers: int = 1  # `ledger worker` processes sharing the topic's partitions
    indexers: int = 1  # `ledger indexer` processes sharing the outbox
    embedders: int = 1  # and `ledger embedder` processes sharing the embed queue
    notes: list[str] = field(default_factory=list)


def private_settings(base: Settings, stamp: str) -> Settings:
    return base.private(
        unique_name(f"bench_{stamp.lower()}"),
        api_port=free_port(),
        api_keys={API_KEY: [TENANT, PROBE_TENANT, LOAD_TENANT, AUDIT_TENANT, "bench-warmup"]},
    )


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:<26}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
    )


# --- steps -----------------------------------------------------------------------------------------


def _raw(s: Settings, events: list[dict], cfg: RunConfig, console: Console) -> dict[str, Any]:
    from bench.raw import bench_es_bulk, bench_fastembed, bench_kafka_produce, bench_pg_copy

    try:
        from projections.search.cues import embedding_text
    except ImportError:  # the search projection is not installed: embed the statement only

        def embedding_text(content, key, aliases=()):
            return content or ""

    asserted = [e for e in events if e["type"] == "memory.asserted"]
    out: dict[str, Any] = {}
    with console.status("raw: Kafka produce (kafka-python, acks=all)"):
        payloads = []
        for e in events:
            ev = from_dict(e)
            payloads.append((ev.kafka_key, encode(ev)))
        out["kafka_produce"] = {**bench_kafka_produce(s, payloads), "unit": "events"}
    with console.status("raw: PostgreSQL COPY"):
        out["pg_copy"] = {**bench_pg_copy(s, events), "unit": "rows"}
    texts = [embedding_text(e.get("content"), e.get("key"), e.get("aliases") or ()) for e in asserted[: cfg.raw_embed]]
    with console.status(f"raw: fastembed, {len(texts)} texts"):
        stats, vecs = bench_fastembed(s, texts)
        out["fastembed"] = {**stats, "unit": "texts"}
    docs = asserted[: cfg.raw_es]
    with console.status(f"raw: Elasticsearch bulk, {len(docs)} docs with vectors"):
        tiled = [vecs[i % len(vecs)] for i in range(len(docs))]
        out["es_bulk"] = {**bench_es_bulk(s, docs, tiled), "unit": "docs"}
    slowest = min(out, key=lambda k: out[k]["per_s"])
    out["slowest"] = slowest
    for k in ("kafka_produce", "pg_copy", "fastembed", "es_bulk"):
        console.print(f"  raw {k:<14} {out[k]['per_s']:>10,.0f} {out[k]['unit']}/s  (n={out[k]['n']})")
    return out


def _phases(events: list[dict], points: tuple[int, ...]) -> list[tuple[int, int | None]]:
    """(end index into events, recall point or None): split where the running count of assertions hits a point."""
    ends: list[tuple[int, int | None]] = []
    asserted = 0
    todo = sorted(p for p in points if p > 0)
    for i, e in enumerate(events):
        asserted += e["type"] == "memory.asserted"
        if todo and asserted >= todo[0]:
            ends.append((i + 1, todo.pop(0)))
    if not ends or ends[-1][0] < len(events):
        ends.append((len(events), None))
    return ends


def _warmup(s: Settings, svc: Services, probe: Probe) -> None:
    """One event through every process: the worker joined its group, the indexer loaded the model."""
    ev = {
        "type": "memory.asserted",
        "tenant": "bench-warmup",
        "subject": "project:W0",
        "key": "project.port",
        "value": 1,
        "content": "项目 W0 的后端服务端口是 1",
        "entities": ["W0"],
    }
    with LedgerProducer(s) as p:
        p.publish(ev)
    wait_caught_up(probe, timeout=180, alive=svc.check_alive)


def _audit_events(n: int, seed: int = 21) -> list[dict]:
    r = random.Random(seed)
    attrs = [a for a in ATTRIBUTES if a.subject_kind == "user"]
    t = datetime(2025, 6, 1, tzinfo=UTC)
    out = []
    for i in range(n):
        a = r.choice(attrs)
        value, zh, _ = a.value(r)
        t += timedelta(minutes=7)
        out.append(
            {
                "event_id": uuid.UUID(int=r.getrandbits(128)).hex,
                "type": "memory.asserted" if i % 5 else "memory.confirmed",
                "tenant": AUDIT_TENANT,
                "subject": "user:audit-1k",
                "key": a.key,
                "kind": a.kind,
                **({"value": value, "content": a.state_zh.format(E="UA1K", zh=zh)} if i % 5 else {}),
                "entities": ["UA1K"],
                "observed_at": rfc3339(t),
            }
        )
    return out


# --- the run ----------------------------------------------------------------------------------------


@contextmanager
def recorded(
    res: dict[str, Any], path: Path, s: Settings, svc: Services, *, keep: bool, console: Console, what: str
) -> Iterator[None]:
    """Whatever happens inside: a failure goes into `res` (error, traceback; Ctrl-C still stops the caller), the
    services stop, `res` is written to `path` with the load at the end, and the private names are dropped unless
    `keep`. A failed or stopped run leaves its results file, not stray processes or names."""
    try:
        yield
    except BaseException as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-4000:]
        console.print(f"[red]{what} failed:[/] {res['error']} (logs in {svc.log_dir})")
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        svc.stop()
        res["load_average_end"] = load_average()
        res["finished_at"] = datetime.now(UTC).isoformat()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
        if not keep:
            try:
                drop_private(s)
            except Exception as exc:  # noqa: BLE001 - clean-up failure is reported, not fatal
                console.print(f"[yellow]clean-up incomplete:[/] {exc}")


def run_bench(cfg: RunConfig, console: Console | None = None) -> Path:
    """Run everything, write bench/results/<UTC>.json and BENCHMARKS.md; returns the JSON path."""
    console = console or Console()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    s = private_settings(get_settings(), stamp)
    res: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "names": {"topic": s.topic, "pg_schema": s.pg_schema, "es_index": s.es_index},
        "machine": machine_info(s),
        "code": code_version(),
        "load_average_start": load_average(),
        "notes": list(cfg.notes),
    }
    console.print(f"[bold]bench run[/] {stamp}: {cfg.events:,} events over {cfg.subjects:,} subjects -> {s.pg_schema}")
    with console.status("generating the dataset"):
        events = list(generate(cfg.events, cfg.subjects, seed=cfg.seed, tenants=(TENANT,)))
    kinds: dict[str, int] = {}
    for e in events:
        k = e["type"] if e["type"] != "memory.asserted" else f"asserted/{e.get('kind', 'state')}"
        kinds[k] = kinds.get(k, 0) + 1
    res["dataset"] = {"events": len(events), "subjects": cfg.subjects, "by_type": dict(sorted(kinds.items()))}

    if "raw" not in cfg.skip:
        res["raw"] = _raw(s, events, cfg, console)
    if "publish" not in cfg.skip:
        from bench.publish import compare_publish

        with console.status(f"SDK publish vs raw Kafka produce, {cfg.publish_rounds} alternating rounds"):
            res["publish"] = pub = compare_publish(s, events, cfg.publish_rounds)
        console.print(
            f"  SDK publish {pub['sdk_per_s']:,.0f} events/s vs raw kafka-python {pub['raw_per_s']:,.0f}/s: "
            f"ratio {pub['ratio']} (target >= {pub['target']})"
        )
    svc = Services(s, s.log_dir / f"bench-{stamp}")  # git-ignored (.data)
    path = cfg.out_dir / f"{stamp}.json"
    with recorded(res, path, s, svc, keep=cfg.keep, console=console, what="run"):
        _pipeline(cfg, s, svc, events, res, console)
    console.print(f"results: {path}")
    if "error" not in res and cfg.out_dir == RESULTS:  # BENCHMARKS.md shows the default results folder only
        from bench.report import write_report

        md = write_report(path)
        console.print(f"report: {md}")
    return path


def _pipeline(cfg: RunConfig, s: Settings, svc: Services, events: list[dict], res: dict, console: Console) -> None:
    stages = ["indexer", *(f"indexer-{k}" for k in range(2, cfg.indexers + 1))]
    stages += ["embedder", *(f"embedder-{k}" for k in range(2, cfg.embedders + 1))]
    workers = ["worker", *(f"worker-{k}" for k in range(2, cfg.workers + 1))]
    svc.start(*workers, *stages, "api")
    res["processes"] = {"workers": cfg.workers, "indexers": cfg.indexers, "embedders": cfg.embedders}
    probe = Probe(s)
    with console.status("warming up worker, indexer and API"):
        _warmup(s, svc, probe)

    # --- end-to-end ingest in phases, recall latency at each point
    phases = _phases(events, cfg.recall_at)
    producer = LedgerProducer(s)
    e2e_phases: list[dict[str, Any]] = []
    res["recall_latency"] = []
    queries = recall_queries(events, TENANT, cfg.recall_queries)
    start = 0
    with _progress(console) as bar:
        t_pub = bar.add_task("publish (SDK)", total=len(events), rate="")
        t_pg = bar.add_task("visible in PostgreSQL", total=len(events), rate="")
        t_es = bar.add_task("indexed in Elasticsearch", total=None, rate="")
        t_vec = bar.add_task("with vectors (semantic)", total=None, rate="")
        base_applied = probe.progress().applied
        base_docs = probe.es_docs()
        t_first = time.perf_counter()

        def show(p) -> None:
            el = max(time.perf_counter() - t_first, 1e-6)
            applied = p.applied - base_applied
            bar.update(t_pg, completed=applied, rate=f"{applied / el:,.0f}/s")
            bar.update(t_es, completed=p.es_docs - base_docs, total=p.versions - base_docs + p.outbox or None)
            bar.update(t_es, rate=f"{(p.es_docs - base_docs) / el:,.0f} docs/s")
            total = p.versions - base_docs or None
            with_vectors = max(p.versions - base_docs - p.embed_pending - p.outbox, 0)
            bar.update(t_vec, completed=with_vectors, total=total, rate=f"{with_vectors / el:,.0f} versions/s")

        published, published_s = [0], [0.0]
        worker_cpu_s = 0.0  # the workers' CPU over each phase, until PostgreSQL holds it (not their idle wait after)
        for end, point in phases:
            chunk = events[start:end]

            t_phase = time.perf_counter()
            caught = CaughtUpCpu({name: svc.procs[name].pid for name in workers})

            def shown(p: Any, caught: CaughtUpCpu = caught) -> None:
                caught(p)
                show(p)

            def on_chunk(n: int, t_phase: float = t_phase) -> None:
                published[0] += n
                el = published_s[0] + time.perf_counter() - t_phase
                bar.update(t_pub, advance=n, rate=f"{published[0] / el:,.0f}/s")
                show(probe.progress())

            recs = {}
            if cfg.profile and end == len(events):
                secs = 30
                recs = {n: Recording(svc.procs[n].pid, secs, svc.log_dir / f"{n}.pyspy") for n in ("indexer", "worker")}
            pub_s = publish_events(s, chunk, producer=producer, on_chunk=on_chunk)
            published_s[0] += pub_s
            # each phase waits for exact/keyword visibility only: the embedders keep working through the next phase,
            # as under a steady load; the vectors' catch-up is timed once, after the last phase
            pg_s, es_s, _ = wait_caught_up(
                probe,
                timeout=cfg.catchup_timeout,
                on_progress=shown,
                alive=svc.check_alive,
                interval=0.1,
                semantic=False,
            )
            worker_cpu_s += sum(caught.used(name) for name in workers)
            prog = probe.progress()
            phase = {
                "events": len(chunk),
                "publish_s": round(pub_s, 3),
                "pg_visible_s": round(pub_s + pg_s, 3),
                "es_visible_s": round(es_s + pub_s, 3),
                "fact_versions_total": prog.versions,
            }
            e2e_phases.append(phase)
            for n, rec in recs.items():
                res.setdefault("profiles", {})[f"{n} during ingest"] = rec.wait()
            start = end
            if point is not None:
                if "recall" in cfg.skip:
                    continue
                bar.stop()
                rl = recall_latency(svc.url, API_KEY, TENANT, queries, ("exact", "keyword", "semantic"))
                res["recall_latency"].append({"fact_versions": prog.versions, "events": end, "modes": rl})
                bar.start()
        with_vectors_at_es = probe.progress()
        _, _, vec_s = wait_caught_up(
            probe, timeout=cfg.catchup_timeout, on_progress=show, alive=svc.check_alive, interval=0.5
        )
    producer.close()
    n = len(events)
    semantic_total = time.perf_counter() - t_first
    pg_total = sum(p["pg_visible_s"] for p in e2e_phases)
    es_total = sum(p["es_visible_s"] for p in e2e_phases)
    e2e = {
        "events": n,
        "phases": e2e_phases,
        "publish_s": round(sum(p["publish_s"] for p in e2e_phases), 3),
        # the SDK's rate while the worker, indexer and embedders share the machine (alone: res["publish"])
        "publish_events_per_s": round(n / max(sum(p["publish_s"] for p in e2e_phases), 1e-9), 1),
        "pg_visible_s": round(pg_total, 3),
        "es_visible_s": round(es_total, 3),
        "pg_events_per_s": round(n / pg_total, 1),
        "events_per_s": round(n / es_total, 1),  # exact- and keyword-queryable in ES: the end-to-end rate
        # and every version with its vectors: from the first publish to the last vector stored
        "semantic_visible_s": round(semantic_total, 3),
        "semantic_events_per_s": round(n / semantic_total, 1),
        "embed_backlog_when_es_done": with_vectors_at_es.embed_pending,
        "semantic_tail_s": round(vec_s or 0.0, 3),
        "es_to_pg_ratio": round(pg_total / es_total, 3),  # target >= 0.5
        "worker_cpu_us_per_event": round(worker_cpu_s / n * 1e6, 1),
        "fact_versions": e2e_phases[-1]["fact_versions_total"],
    }
    raw = res.get("raw")
    if raw:
        e2e["pg_to_raw_kafka_ratio"] = round(e2e["pg_events_per_s"] / raw["kafka_produce"]["per_s"], 3)  # >= 0.4
        slow = raw[raw["slowest"]]
        e2e["slowest_raw"] = raw["slowest"]
        e2e["ratio_to_slowest_raw"] = round(e2e["events_per_s"] / slow["per_s"], 3)
        if raw["slowest"] == "fastembed":  # the embedding bounds the semantic rate only, since two-phase indexing
            # the pipeline embeds one text per fact version, not per event: the bound in events/s
            versions_per_event = max(sum(e["type"] == "memory.asserted" for e in events) / n, 1e-9)
            e2e["embedding_bound_events_per_s"] = round(slow["per_s"] / versions_per_event, 1)
            e2e["ratio_to_embedding_bound"] = round(
                e2e["semantic_events_per_s"] / e2e["embedding_bound_events_per_s"], 3
            )
    res["e2e"] = e2e
    console.print(
        f"  end to end: {e2e['events_per_s']:,.0f} events/s exact/keyword-queryable "
        f"(PG alone {e2e['pg_events_per_s']:,.0f}/s, ratio {e2e['es_to_pg_ratio']}; with vectors "
        f"{e2e['semantic_events_per_s']:,.0f}/s); PG to raw Kafka {e2e.get('pg_to_raw_kafka_ratio')}; "
        f"worker CPU {e2e['worker_cpu_us_per_event']} µs/event"
    )
    last = res["recall_latency"][-1]["events"] if res["recall_latency"] else 0
    if last != n and "recall" not in cfg.skip:
        with console.status("recall latency at full size"):
            rl = recall_latency(svc.url, API_KEY, TENANT, queries, ("exact", "keyword", "semantic"))
        res["recall_latency"].append({"fact_versions": e2e["fact_versions"], "events": n, "modes": rl})
    if cfg.profile and "recall" not in cfg.skip:
        with console.status("profiling the API under exact recall (py-spy, 20 s)"):
            rec = Recording(svc.procs["api"].pid, 20, svc.log_dir / "api.pyspy")
            t_end = time.perf_counter() + 21
            while time.perf_counter() < t_end:
                recall_latency(svc.url, API_KEY, TENANT, queries[:50], ("exact",), warmup=0)
            res.setdefault("profiles", {})["api under exact recall"] = rec.wait()
    for point in res["recall_latency"]:
        for mode, v in point["modes"].items():
            console.print(
                f"  recall {mode:<8} @ {point['fact_versions']:>7,} versions: "
                f"p50 {v['p50_ms']} ms, p99 {v['p99_ms']} ms"
            )

    if "eval" not in cfg.skip:
        from bench.eval import run_eval

        with console.status("quality (python -m bench eval)"):
            res["eval"] = run_eval(s, svc.url, API_KEY, TENANT, sample=cfg.eval_sample)
        sr = res["eval"]["retrieval"]["self_retrieval"]
        console.print(f"  self-retrieval R@1 {sr['recall_at_1']}, R@10 {sr['recall_at_10']}")

    if "lag" not in cfg.skip:
        with console.status("lag: seeding probe facts"):
            publish_events(s, probe_seed_events())
            wait_caught_up(probe, timeout=300, alive=svc.check_alive)
        rate = e2e["events_per_s"] / 2 if cfg.lag_rate is None else cfg.lag_rate
        with console.status(f"lag: steady load at {rate:,.0f} events/s for {cfg.lag_seconds:.0f}s"):
            res["lag"] = measure_lag_apart(
                s, svc.url, API_KEY, rate, duration=cfg.lag_seconds, probe_rate=cfg.probe_rate, log_dir=svc.log_dir
            )
            res["lag"]["rate_given"] = cfg.lag_rate is not None  # not half the end-to-end rate: the report says so
            res["lag"]["client_nice"] = CLIENT_NICE
            wait_caught_up(probe, timeout=cfg.catchup_timeout, alive=svc.check_alive)
        a = res["lag"]["all"]
        console.print(
            f"  lag PG p50 {a['pg']['p50_ms']} p99 {a['pg']['p99_ms']} ms; recall p99 {a['recall']['p99_ms']} ms; "
            f"vectors p50 {a['vector']['p50_ms']} p99 {a['vector']['p99_ms']} ms"
        )

    if "audit" not in cfg.skip:
        with console.status(f"audit: {cfg.audit_events} events of one subject"):
            publish_events(s, _audit_events(cfg.audit_events))
            wait_caught_up(probe, timeout=600, alive=svc.check_alive)
            res["audit"] = audit_latency(svc.url, API_KEY, AUDIT_TENANT, "user:audit-1k")
        console.print(f"  audit replay of {res['audit']['events']} events: p50 {res['audit']['p50_ms']} ms")

    if "rebuild" not in cfg.skip:
        from stream_processors.rebuild import rebuild

        svc.stop()
        total = sum(probe.end_offsets().values())
        with _progress(console) as bar:
            task = bar.add_task("rebuild from offset 0", total=total, rate="")
            t0 = time.perf_counter()

            def adv(k: int) -> None:
                bar.update(task, advance=k, rate=f"{bar.tasks[0].completed / (time.perf_counter() - t0):,.0f}/s")

            rep = rebuild(s, keep_old=False, progress=adv)
        res["rebuild"] = {
            "records": rep.records,
            "seconds": round(rep.seconds, 3),
            "events_per_s": round(rep.records / rep.seconds, 1),
            "checksum_equal": rep.live_checksum == rep.rebuilt_checksum,
        }
        console.print(
            f"  rebuild: {res['rebuild']['events_per_s']:,.0f} events/s, same checksum: "
            f"{res['rebuild']['checksum_equal']}"
        )
    probe.close()

    if "ryw" not in cfg.skip:  # its own private services: after the rebuild, which stops this run's
        from bench.ryw import run_ryw

        with console.status(f"read-your-writes: {cfg.ryw_pairs} pairs over HTTP and over MCP"):
            ryw = run_ryw(pairs=cfg.ryw_pairs, chains=10, stamp=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
        res["ryw"] = {door: {k: v for k, v in r.items() if k != "pair_ms_all"} for door, r in ryw["doors"].items()}
        for door, r in res["ryw"].items():
            console.print(
                f"  read-your-writes {door}: {r['misses']} misses of {r['pairs']}, pair p99 {r['pair_ms']['p99_ms']} ms"
            )

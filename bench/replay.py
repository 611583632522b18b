"""`python -m bench.replay NAME`: the projection's speed on a kept bench topic, without the rest of the pipeline.

For profiling the worker and the rebuild. NAME is a `python -m bench run --keep` run's private name
(`bench_<stamp>`); its topic and schema are left as they are. Two measures, each into a fresh schema, each ending
with the projection checksum compared with the kept schema's (the result must not change):

- `replay` (default): `stream_processors.rebuild.replay` in this process (Kafka poll, decode, Recorder), wall
  time, this process's CPU per record; `--profile` prints cProfile's top functions;
- `--worker`: a real `ledger worker` (faust) with its own consumer group over the same topic, timed from its first
  committed batch to the end offsets, with the worker's CPU per record; `--batch` sets LEDGER_PROCESSOR_BATCH_SIZE;
  `--profile [PATH]` records the worker with py-spy over the same span and prints its top functions.

`--code DIR` runs another copy of the code (a tree without a change, for before/after on the same data).

`--produce N` first makes NAME such a kept run without the rest of the bench: N events of `bench.dataset`
(`--subjects`, seed 7) produced with a raw kafka-python producer (acks=all) to NAME's fresh topic, then replayed
in process into NAME's schema, the reference every later replay's checksum is compared with.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import signal
import sys
import time
from pathlib import Path

import psycopg

from bench.machine import cpu_seconds
from bench.profile import Recording
from infra.procs import launch, terminate
from producers.settings import Settings, get_settings
from producers.topics import end_offsets
from projections.postgres.positions import stored_positions
from projections.postgres.queries import projection_checksum
from projections.postgres.schema import continue_revisions, copy_erasure_salt, create_schema, drop_schema

__all__ = ["produce", "replay_once", "worker_once"]


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def _checksums(s: Settings, kept: str, fresh: str) -> str:
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        a, b = projection_checksum(conn, kept), projection_checksum(conn, fresh)
        drop_schema(conn, fresh)
        conn.execute(f'DROP SCHEMA IF EXISTS "{fresh}_keys" CASCADE')
    return f"checksum kept {a} replayed {b}: {'equal' if a == b else 'DIFFERENT'}"


def produce(name: str, n: int, subjects: int) -> str:
    """NAME's topic filled with `n` dataset events (raw producer), then replayed into NAME's schema (the reference)."""
    from kafka import KafkaProducer

    from bench.dataset import generate
    from producers.contract import encode, from_dict
    from producers.kafka_producer import kafka_connection
    from producers.topics import ensure_topics
    from stream_processors.rebuild import replay

    s = get_settings().private(name)
    if _topic_exists(s) and sum(end_offsets(s).values()):
        raise SystemExit(f"{s.topic} already holds records: choose a fresh name")
    ensure_topics(s)
    payloads = [(ev.kafka_key, encode(ev)) for ev in (from_dict(e) for e in generate(n, subjects))]
    producer = KafkaProducer(**kafka_connection(s), acks="all", linger_ms=5, batch_size=256 * 1024)
    try:
        t0 = time.perf_counter()
        for key, value in payloads:
            producer.send(s.topic, key=key, value=value)
        producer.flush()
        produced = time.perf_counter() - t0
    finally:
        producer.close()
    with psycopg.connect(s.pg_dsn) as admin:
        create_schema(admin, s.pg_schema)
    c0, t0 = time.process_time(), time.perf_counter()
    applied = replay(s, s.pg_schema, end_offsets(s))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return (
        f"produced {len(payloads)} records to {s.topic} in {produced:.2f} s; reference replay into {s.pg_schema}: "
        f"{applied} records in {wall:.2f} s, CPU {1e6 * cpu / max(applied, 1):.0f} us/record; load {_load()}"
    )


def _topic_exists(s: Settings) -> bool:
    from kafka import KafkaAdminClient

    from producers.kafka_producer import kafka_connection

    admin = KafkaAdminClient(**kafka_connection(s))
    try:
        return s.topic in set(admin.list_topics())
    finally:
        admin.close()


def replay_once(name: str, batch: int = 2000, profile: bool = False) -> str:
    """Replay the kept topic into a fresh schema in this process; one line of numbers (and the checksum line)."""
    from stream_processors.rebuild import replay

    s = get_settings().private(name)
    fresh = f"{s.pg_schema}_r{int(time.time()) % 100000}"
    with psycopg.connect(s.pg_dsn) as admin:
        create_schema(admin, fresh)
        copy_erasure_salt(admin, s.pg_schema, fresh)
        continue_revisions(admin, s.pg_schema, fresh)
    prof = cProfile.Profile() if profile else None
    c0, t0 = time.process_time(), time.perf_counter()
    if prof:
        prof.enable()
    n = replay(s, fresh, end_offsets(s), batch_size=batch)
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    line = (
        f"replay batch {batch}: {n} records in {wall:.2f} s = {n / wall:,.0f} records/s; CPU {1e6 * cpu / n:.0f} "
        f"us/record; load {_load()}\n{_checksums(s, s.pg_schema, fresh)}"
    )
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return line


def worker_once(name: str, batch: int | None = None, code: str | None = None, profile: str | None = None) -> str:
    """A `ledger worker` (of `code`, default this tree) over the kept topic into a fresh schema and group.

    `profile`: a py-spy recording (raw) of the worker from its first batch to the end, to that path; its summary
    (bench.profile.summarize) follows the numbers."""
    base = get_settings().private(name)
    tag = f"w{int(time.time()) % 100000}"
    s = base.model_copy(update={"pg_schema": f"{base.pg_schema}_{tag}", "processor_group": f"{name}-{tag}"})
    total = sum(end_offsets(s).values())
    env = {**s.child_environ(), "PYTHONUNBUFFERED": "1"}
    if code:
        env["PYTHONPATH"] = code
    if batch:
        env["LEDGER_PROCESSOR_BATCH_SIZE"] = str(batch)
    log = s.log_dir / f"replay-{tag}.log"
    proc = launch([sys.executable, "-m", "infra.cli", "worker", "--loglevel", "warning"], log, env, code or None)
    try:
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            first = None
            recording: Recording | None = None
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited with {proc.returncode} (log {log})")
                try:
                    done = sum(stored_positions(conn, s.processor_group, s.topic, schema=s.pg_schema).values())
                except psycopg.Error:
                    done = 0
                now = time.perf_counter()
                if done and first is None:
                    first = (now, done, cpu_seconds(proc.pid))
                    if profile:
                        recording = Recording(proc.pid, 1800, Path(profile))
                if done >= total:
                    break
                time.sleep(0.05)
            assert first is not None
            t1, n1, c1 = first
            n, wall, cpu = total - n1, now - t1, cpu_seconds(proc.pid) - c1
            summary = _stop(recording) if recording is not None else None
    finally:
        terminate(proc, 30, group=True)
    line = (
        f"worker batch {batch or s.processor_batch_size}: {n} records after its first batch in {wall:.2f} s = "
        f"{n / wall:,.0f} records/s; worker CPU {1e6 * cpu / n:.0f} us/record; load {_load()}\n"
        f"{_checksums(s, base.pg_schema, s.pg_schema)}"
    )
    return line if summary is None else f"{line}\n{_summary_text(summary)}"


def _stop(recording: Recording) -> dict | None:
    """End a py-spy recording now (SIGINT: it writes what it sampled) and summarize it."""
    if recording.proc is not None and recording.proc.poll() is None:
        recording.proc.send_signal(signal.SIGINT)
    return recording.wait(top=20)


def _summary_text(summary: dict) -> str:
    lines = [f"py-spy: {summary['samples']} samples"]
    for title, key in (("self", "top_self_pct"), ("inclusive, ours", "top_ours_inclusive_pct")):
        lines.append(f"top {title}:")
        lines += [f"  {pct:5.1f}%  {fn}" for fn, pct in summary[key]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.splitlines()[0])
    ap.add_argument("name", help="the kept run's private name (bench_<stamp>)")
    ap.add_argument("--worker", action="store_true", help="run a real `ledger worker` instead of an in-process replay")
    ap.add_argument("--batch", type=int, default=None, help="batch size (replay: 2000, the rebuild's; worker: setting)")
    ap.add_argument(
        "--profile",
        nargs="?",
        const="",
        default=None,
        help="replay: cProfile it; --worker: py-spy the worker, raw output to this path (default under /tmp)",
    )
    ap.add_argument("--code", default=None, help="the worker's code tree (default: this one)")
    ap.add_argument("--produce", type=int, default=None, help="first make NAME: produce N dataset events, replay them")
    ap.add_argument("--subjects", type=int, default=2000, help="subjects of the --produce dataset")
    args = ap.parse_args()
    if args.produce:
        print(produce(args.name, args.produce, args.subjects))
        return
    if args.worker:
        out = args.profile or f"/tmp/{args.name}-worker-{int(time.time())}.pyspy"
        print(worker_once(args.name, args.batch, args.code, out if args.profile is not None else None))
    else:
        print(replay_once(args.name, args.batch or 2000, args.profile is not None))


if __name__ == "__main__":
    main()

"""`python -m bench.replay NAME`: the projection's speed on a kept bench topic, without the rest of the pipeline.

For profiling the worker and the rebuild. NAME is a `python -m bench run --keep` run's private name
(`bench_<stamp>`); its topic and schema are left as they are. Two measures, each into a fresh schema, each ending
with the projection checksum compared with the kept schema's (the result must not change):

- `replay` (default): `stream_processors.rebuild.replay` in this process (Kafka poll, decode, Recorder), wall
  time, this process's CPU per record; `--profile` prints cProfile's top functions;
- `--worker`: a real `ledger worker` (faust) with its own consumer group over the same topic, timed from its first
  committed batch to the end offsets, with the worker's CPU per record; `--batch` sets LEDGER_PROCESSOR_BATCH_SIZE.

`--code DIR` runs another copy of the code (a tree without a change, for before/after on the same data).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import psycopg

from infra.procs import launch, terminate
from producers.settings import Settings, get_settings
from producers.topics import end_offsets
from projections.postgres.positions import stored_positions
from projections.postgres.queries import projection_checksum
from projections.postgres.schema import continue_revisions, copy_erasure_salt, create_schema, drop_schema

__all__ = ["replay_once", "worker_once"]


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _checksums(s: Settings, kept: str, fresh: str) -> str:
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        a, b = projection_checksum(conn, kept), projection_checksum(conn, fresh)
        drop_schema(conn, fresh)
        conn.execute(f'DROP SCHEMA IF EXISTS "{fresh}_keys" CASCADE')
    return f"checksum kept {a} replayed {b}: {'equal' if a == b else 'DIFFERENT'}"


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


def worker_once(name: str, batch: int | None = None, code: str | None = None) -> str:
    """A `ledger worker` (of `code`, default this tree) over the kept topic into a fresh schema and group."""
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
    proc = launch([sys.executable, "-m", "api.cli", "worker", "--loglevel", "warning"], log, env, code or None)
    try:
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            first = None
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
                    first = (now, done, _cpu_s(proc.pid))
                if done >= total:
                    break
                time.sleep(0.05)
            assert first is not None
            t1, n1, c1 = first
            n, wall, cpu = total - n1, now - t1, _cpu_s(proc.pid) - c1
    finally:
        terminate(proc, 30, group=True)
    return (
        f"worker batch {batch or s.processor_batch_size}: {n} records after its first batch in {wall:.2f} s = "
        f"{n / wall:,.0f} records/s; worker CPU {1e6 * cpu / n:.0f} us/record; load {_load()}\n"
        f"{_checksums(s, base.pg_schema, s.pg_schema)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.splitlines()[0])
    ap.add_argument("name", help="the kept run's private name (bench_<stamp>)")
    ap.add_argument("--worker", action="store_true", help="run a real `ledger worker` instead of an in-process replay")
    ap.add_argument("--batch", type=int, default=None, help="batch size (replay: 2000, the rebuild's; worker: setting)")
    ap.add_argument("--profile", action="store_true", help="cProfile the in-process replay")
    ap.add_argument("--code", default=None, help="the worker's code tree (default: this one)")
    args = ap.parse_args()
    if args.worker:
        print(worker_once(args.name, args.batch, args.code))
    else:
        print(replay_once(args.name, args.batch or 2000, args.profile))


if __name__ == "__main__":
    main()

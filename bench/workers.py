"""`python -m bench workers`: the projector's scale-out, 1, 2, 3 `ledger worker` processes on one topic.

Per worker count, mode and round: fresh private names (topic of 6 partitions, consumer group, schema), the workers
started as an operator starts them (bench.services: `ledger worker`, worker-2, ...), the group joined (the broker's
view: that many members, Stable), a warm-up applied on every partition. Then the dataset, in one of two modes:

- `live`: the clock runs from the first publish (bench.loader.publish_events, the SDK, as a service publishes) until
  the stored positions reach the topic's end offsets (bench.catchup: visible in PostgreSQL); the publisher runs on
  the same machine meanwhile, as in `python -m bench run`;
- `backlog`: the workers are frozen (SIGSTOP) while the dataset is published, for less than the group's session
  timeout (10 s), so the group stays as it was; the clock runs from their SIGCONT until the positions reach the end:
  the rate at which they drain a backlog with nothing else of ours running.

Reported per count and mode: events/s, and worker CPU per event (the user + system CPU of all the workers together
over the events). Counts alternate in order between rounds (1, 2, 3, then 3, 2, 1) so a shared machine's load falls
on all alike; every run must write the same projection.

On a machine of few cores the workers share them with PostgreSQL and Kafka (and, live, the publisher): the rate says
how much of those cores the workers get, not how far they would scale on cores of their own. The results file
records the cores and the load average at the start and end of each run. Writes bench/results/workers-<UTC>.json;
drops its private names.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import typer

__all__ = ["scale_out", "workers_command"]

TENANT = "bench"
WARMUP = 60  # events over as many subjects: every partition gets some (checked)
MODES = ("live", "backlog")
FROZEN_MAX_S = 8.0  # a backlog published in longer would outlast the group's session timeout (10 s): a rebalance


def _group(settings: Any) -> tuple[str, int]:
    """(state, members) of the workers' consumer group, as the broker sees it."""
    from kafka import KafkaAdminClient

    from producers.kafka_producer import kafka_connection

    admin = KafkaAdminClient(**kafka_connection(settings))
    try:
        group = admin.describe_groups([settings.processor_group])[settings.processor_group]
    finally:
        admin.close()
    return group.get("group_state", ""), len(group.get("members") or ())


def _joined(settings: Any, svc: Any, n: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := _group(settings)) != ("Stable", n):
        svc.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} workers did not form a stable group in {timeout:.0f}s (last: {seen})")
        time.sleep(0.5)


def _run(settings: Any, events: list[dict], n: int, mode: str, log_dir: Path) -> dict[str, Any]:
    """n workers on fresh names: joined, warmed up, then `events` in `mode` (the module docstring), timed."""
    from bench.catchup import Probe, wait_caught_up
    from bench.loader import publish_events
    from bench.machine import cpu_seconds, load_average
    from bench.services import Services
    from producers.sdk import LedgerProducer
    from producers.topics import ensure_topics

    ensure_topics(settings)
    probe = Probe(settings)
    producer = LedgerProducer(settings)
    names = ["worker", *(f"worker-{i}" for i in range(2, n + 1))]
    try:
        with Services(settings, log_dir) as svc:
            svc.start(*names)
            _joined(settings, svc, n)
            warm = [dict(events[i], event_id=uuid.uuid4().hex, subject=f"project:warmup-{i}") for i in range(WARMUP)]
            publish_events(settings, warm, producer=producer)
            assert all(probe.end_offsets().values()), "the warm-up missed a partition"
            wait_caught_up(probe, timeout=300, alive=svc.check_alive, search=False)
            _joined(settings, svc, n, timeout=30)  # nobody left or joined meanwhile
            load_start = load_average()
            pids = [svc.procs[name].pid for name in names]
            if mode == "backlog":
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                try:
                    publish_s = publish_events(settings, events, producer=producer)
                finally:
                    cpu0 = [cpu_seconds(pid) for pid in pids]
                    t0 = time.perf_counter()
                    for pid in pids:
                        os.kill(pid, signal.SIGCONT)
                if publish_s > FROZEN_MAX_S:
                    raise RuntimeError(f"publishing the backlog took {publish_s:.1f}s: use fewer --events")
            else:
                cpu0 = [cpu_seconds(pid) for pid in pids]
                t0 = time.perf_counter()
                publish_s = publish_events(settings, events, producer=producer)
            wait_caught_up(probe, timeout=3600, interval=0.05, alive=svc.check_alive, search=False)
            seconds = time.perf_counter() - t0
            cpu = [cpu_seconds(pid) - c for pid, c in zip(pids, cpu0, strict=True)]
            _joined(settings, svc, n, timeout=30)  # the same group throughout
            load_end = load_average()
        projected = probe.projected()
    finally:
        producer.close()
        probe.close()
    return {
        "workers": n,
        "mode": mode,
        "seconds": round(seconds, 3),
        "publish_s": round(publish_s, 3),
        "events_per_s": round(len(events) / seconds, 1),
        "worker_cpu_s": [round(c, 2) for c in cpu],  # each worker's: each took a share
        "cpu_us_per_event": round(sum(cpu) / len(events) * 1e6, 1),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "projected": projected,
    }


def scale_out(base: Any, stamp: str, events: list[dict], counts: list[int], rounds: int, log_dir: Path) -> dict:
    """Every count in both modes in every round (order alternating), fresh names each; the medians."""
    from bench.services import drop_private

    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for n in counts if r % 2 == 0 else counts[::-1]:
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                settings = base.private(f"benchworkers_{stamp.lower()}_{n}w_{mode}_r{r}")
                typer.echo(f"round {r + 1}, {n} worker(s), {mode}: {len(events):,} events ...")
                try:
                    run = _run(settings, events, n, mode, log_dir / f"{n}w-{mode}-r{r}")
                finally:
                    drop_private(settings)  # the topics, the schema, the group's faust directory
                typer.echo(
                    f"  {run['events_per_s']:,.0f} events/s, {run['cpu_us_per_event']:.0f} µs worker CPU per event "
                    f"(per worker {run['worker_cpu_s']} s; load {run['load_average_start'][0]})"
                )
                runs.append({"round": r + 1, **run})
    summary: dict[str, dict[str, Any]] = {}
    for n in counts:
        for mode in MODES:
            mine = [x for x in runs if x["workers"] == n and x["mode"] == mode]
            summary.setdefault(str(n), {})[mode] = {
                "median_events_per_s": round(statistics.median(x["events_per_s"] for x in mine), 1),
                "median_cpu_us_per_event": round(statistics.median(x["cpu_us_per_event"] for x in mine), 1),
            }
    same = {tuple(sorted(x["projected"].items())) for x in runs}
    return {"by_workers": summary, "same_projection_in_every_run": len(same) == 1, "runs": runs}


def workers_command(
    workers: str = typer.Option("1,2,3", help="comma-separated worker counts to measure"),
    events: int = typer.Option(20_000, help="events in the dataset (bench.dataset)"),
    subjects: int = typer.Option(2_000, help="subjects in the dataset"),
    rounds: int = typer.Option(2, help="rounds; each measures every count in both modes, on fresh names"),
    seed: int = typer.Option(7, help="dataset seed"),
    out_dir: Path | None = typer.Option(None, help="results folder (default bench/results)"),
) -> None:
    """Worker scale-out: events/s visible in PostgreSQL and worker CPU per event with 1, 2, 3 workers."""
    import sys

    import orjson

    from bench.dataset import generate
    from bench.machine import code_version, load_average, machine_info
    from bench.run import RESULTS
    from producers.settings import get_settings

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = get_settings()
    counts = [int(x) for x in workers.split(",") if x.strip()]
    data = list(generate(events, subjects, seed=seed, tenants=(TENANT,)))
    res: dict[str, Any] = {
        "stamp": stamp,
        "command": "python -m bench workers " + " ".join(sys.argv[2:]),
        "config": {"workers": counts, "events": events, "subjects": subjects, "rounds": rounds, "seed": seed},
        "partitions": base.topic_partitions,
        "cores": os.cpu_count(),
        "machine": machine_info(base),
        "code": code_version(),
        "load_average_start": load_average(),
    }
    res.update(scale_out(base, stamp, data, counts, rounds, base.log_dir / f"bench-workers-{stamp}"))
    res["load_average_end"] = load_average()
    folder = out_dir or RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"workers-{stamp}.json"
    path.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    typer.echo("| workers | live: events/s | live: worker CPU µs/event | backlog: events/s | backlog: CPU µs/event |")
    typer.echo("|---|---|---|---|---|")
    for n, row in res["by_workers"].items():
        live, backlog = row["live"], row["backlog"]
        typer.echo(
            f"| {n} | {live['median_events_per_s']:,.0f} | {live['median_cpu_us_per_event']:.0f} "
            f"| {backlog['median_events_per_s']:,.0f} | {backlog['median_cpu_us_per_event']:.0f} |"
        )
    typer.echo(f"same projection in every run: {res['same_projection_in_every_run']}; results: {path}")
    if not res["same_projection_in_every_run"]:
        raise typer.Exit(1)

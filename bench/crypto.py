"""`python -m bench crypto`: what encryption costs on publish and on end-to-end ingest, in one run.

Every ratio compares encryption on with encryption off measured in the same run, interleaved round by round in
alternating order (off, on; then on, off; ...), so the noise of a shared 2-core machine falls on both alike.

1. Seal and open, per event (in process, best of 5 passes over the dataset, like timeit): `contract.encode`
   against `envelope.encode_sealed`, and `records.decode_record` of a clear record against `decode_record` +
   `records.open_record` of the sealed one.
2. Publish: the SDK (`LedgerProducer.send_many` in chunks of 2,000, acks=all, bench.loader.publish_events)
   publishes the dataset (default 20,000 events over 2,000 subjects, bench.dataset) to a private topic, one
   producer per mode, created and warmed up once (a first round, not counted, connects and creates the 2,000
   data keys); then `--rounds` timed rounds per mode.
3. End-to-end ingest: per round and mode, fresh private names (topic, schema, key store) and a real worker
   (`ledger worker`, a child process, bench.services); one warm-up event applied, then the clock runs from the
   first publish of the dataset until the worker's stored positions reach the topic's end offsets (applied in
   PostgreSQL, as bench.catchup reads it). The search indexer is not part of it: it reads the clear projection
   in PostgreSQL, so encryption does not touch its path.

The target: encryption costs at most 10% of end-to-end ingest throughput. Writes
bench/results/crypto-<UTC>.json and .md; drops its private topics, schemas and key stores unless `--keep`.
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from bench.latency import per_item_us

__all__ = ["crypto_command", "ingest_cost", "publish_cost", "seal_open_cost"]

TENANT = "bench"
MODES = ("off", "on")


def seal_open_cost(events: Sequence[dict], n: int) -> dict[str, Any]:
    """What sealing adds to encoding one event, and opening to decoding one record (see the module docstring)."""
    from producers.contract import encode, from_dict
    from producers.keys.envelope import DataKey, encode_sealed
    from producers.records import decode_record, open_record

    evs = [from_dict(e) for e in events[:n]]
    key = DataKey(uuid.uuid4().hex, os.urandom(32))
    clear = [encode(e) for e in evs]
    sealed = [encode_sealed(e, key) for e in evs]
    now_ms = int(time.time() * 1000)

    def decode(raw: bytes) -> Any:
        return decode_record("t", 0, 0, raw, timestamp_ms=now_ms)

    incoming = [decode(raw) for raw in sealed]
    assert all(open_record(i, key.key).event is not None for i in incoming)
    out = {
        "events": len(evs),
        "clear_bytes_mean": round(statistics.mean(map(len, clear)), 1),
        "sealed_bytes_mean": round(statistics.mean(map(len, sealed)), 1),
        "encode_us": per_item_us(encode, evs),
        "encode_sealed_us": per_item_us(lambda e: encode_sealed(e, key), evs),
        "decode_clear_us": per_item_us(decode, clear),
        "decode_sealed_us": per_item_us(decode, sealed),
        "open_record_us": per_item_us(lambda i: open_record(i, key.key), incoming),
    }
    out["seal_added_us"] = round(out["encode_sealed_us"] - out["encode_us"], 2)
    out["open_added_us"] = round(out["decode_sealed_us"] + out["open_record_us"] - out["decode_clear_us"], 2)
    return out


def _settings(base: Any, name: str, mode: str) -> Any:
    from pydantic import SecretStr

    from producers.keys.kek import new_kek

    if mode == "on":
        return base.private(name, encryption="on", kek=SecretStr(new_kek()), kek_file=None)
    return base.private(name, encryption="off", kek=None, kek_file=None)


def _order(r: int) -> tuple[str, ...]:
    return MODES if r % 2 == 0 else MODES[::-1]


def _cpu_part(cpu: dict[str, list[float]], n: int) -> dict[str, Any]:
    """CPU µs per event per round and mode; on/off of the medians (less sensitive to other load than wall time)."""
    us = {m: [round(c / n * 1e6, 1) for c in cpu[m]] for m in MODES}
    med = {m: round(statistics.median(us[m]), 1) for m in MODES}
    return {
        "cpu_us_per_event": us,
        "median_cpu_us_per_event": med,
        "cpu_ratio_on_off": round(med["on"] / med["off"], 4),
    }


def _summary(per_round: dict[str, list[float]], n: int) -> dict[str, Any]:
    """events/s per round and mode, medians, the on/off ratio of the medians and of each round's pair."""
    rates = {m: [round(n / s, 1) for s in per_round[m]] for m in MODES}
    med = {m: round(statistics.median(rates[m]), 1) for m in MODES}
    paired = [round(on / off, 4) for off, on in zip(rates["off"], rates["on"], strict=True)]
    ratio = round(med["on"] / med["off"], 4)
    return {
        "seconds": {m: [round(s, 3) for s in per_round[m]] for m in MODES},
        "events_per_s": rates,
        "median_events_per_s": med,
        "ratio_on_off": ratio,  # throughput with encryption / without (1.0 = free)
        "cost_pct": round((1 - ratio) * 100, 1),
        "paired_ratios": paired,
        "median_paired_ratio": round(statistics.median(paired), 4),
    }


def publish_cost(settings: dict[str, Any], events: list[dict], rounds: int, bar: Any) -> dict[str, Any]:
    """The SDK publishing `events` to `settings[mode]`'s topic, off and on, interleaved (the module docstring)."""
    from bench.loader import publish_events
    from producers.sdk import LedgerProducer
    from producers.topics import ensure_topics

    producers: dict[str, Any] = {}
    per_round: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    task = bar.add_task("publish (SDK)", total=len(events) * 2 * (rounds + 1), rate="")
    try:
        for m in MODES:
            ensure_topics(settings[m])
            producers[m] = LedgerProducer(settings[m])
        warmup = {}
        for r in range(-1, rounds):
            for m in _order(r):
                bar.update(task, description=f"publish (SDK) {'warm-up' if r < 0 else f'round {r + 1}'}, {m}")
                cpu0 = time.process_time()  # this process: the SDK and kafka-python's sender thread
                seconds = publish_events(
                    settings[m], events, producer=producers[m], on_chunk=lambda k: bar.advance(task, k)
                )
                used = time.process_time() - cpu0
                bar.update(task, rate=f"{len(events) / seconds:,.0f}/s")
                if r < 0:
                    warmup[m] = round(seconds, 3)
                else:
                    per_round[m].append(seconds)
                    cpu[m].append(used)
    finally:
        for p in producers.values():
            p.close()
    return {**_summary(per_round, len(events)), **_cpu_part(cpu, len(events)), "warmup_seconds": warmup}


def _ingest_once(settings: Any, events: list[dict], log_dir: Path, bar: Any, task: Any) -> dict[str, float]:
    """A worker on fresh names; one warm-up event applied; then publish `events` and time until all applied."""
    from bench.catchup import Probe
    from bench.loader import publish_events
    from bench.machine import cpu_seconds
    from bench.services import Services
    from producers.sdk import LedgerProducer
    from producers.topics import ensure_topics

    ensure_topics(settings)
    probe = Probe(settings)
    producer = LedgerProducer(settings)
    try:
        with Services(settings, log_dir) as svc:
            svc.start("worker")
            warm = dict(events[0], event_id=uuid.uuid4().hex, subject="project:warmup")
            publish_events(settings, [warm], producer=producer)
            _wait_applied(probe, svc, probe.end_offsets(), timeout=300)
            base = sum(probe.positions().values())
            pid = svc.procs["worker"].pid
            cpu0 = cpu_seconds(pid)
            published: dict[str, Any] = {}

            def publish() -> None:  # in a thread: the worker's progress is sampled while the SDK publishes
                try:
                    published["s"] = publish_events(settings, events, producer=producer)
                except BaseException as exc:  # noqa: BLE001 - re-raised in the bench's thread below
                    published["error"] = exc

            thread = threading.Thread(target=publish, daemon=True)
            t0 = time.perf_counter()
            thread.start()
            first: tuple[float, int] | None = None  # (when, how many) the worker's first applied batch was seen
            while thread.is_alive():
                applied = sum(probe.positions().values()) - base
                now = time.perf_counter()
                if first is None and applied > 0:
                    first = (now, applied)
                bar.update(task, completed=applied, rate=f"{applied / max(now - t0, 1e-6):,.0f}/s")
                svc.check_alive()
                time.sleep(0.05)
            thread.join()
            if "error" in published:
                raise published["error"]
            ends = probe.end_offsets()
            seen, done = _wait_applied(probe, svc, ends, timeout=3600, bar=bar, task=task, base=base, t0=t0)
            worker_cpu = cpu_seconds(pid) - cpu0
            first = first or seen
        projected = probe.projected()
    finally:
        producer.close()
        probe.close()
    return {
        "publish_s": published["s"],
        "applied_s": done - t0,
        "first_applied_s": first[0] - t0,
        "applied_at_first": first[1],
        "worker_cpu_s": worker_cpu,
        "projected": projected,
    }


def _wait_applied(
    probe: Any,
    svc: Any,
    ends: dict[int, int],
    *,
    timeout: float,
    bar: Any = None,
    task: Any = None,
    base: int = 0,
    t0: float = 0.0,
) -> tuple[tuple[float, int], float]:
    """Poll the stored positions until they reach `ends`; ((when, how many) at the first new batch seen, when all)."""
    deadline = time.monotonic() + timeout
    first: tuple[float, int] | None = None
    while True:
        positions = probe.positions()
        now = time.perf_counter()
        applied = sum(min(positions.get(p, 0), e) for p, e in ends.items())
        if first is None and applied > base:
            first = (now, applied - base)
        if bar is not None:
            bar.update(task, completed=applied - base, rate=f"{(applied - base) / max(now - t0, 1e-6):,.0f}/s")
        if all(positions.get(p, 0) >= e for p, e in ends.items()):
            return first if first is not None else (now, applied - base), now
        svc.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker did not apply everything in {timeout:.0f}s: {positions} < {ends}")
        time.sleep(0.05)


def ingest_cost(
    base: Any, stamp: str, events: list[dict], rounds: int, bar: Any, log_dir: Path, keep: bool
) -> dict[str, Any]:
    """Publish -> applied by a real worker, off and on, interleaved, fresh names each time."""
    from bench.services import drop_private

    per_round: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for m in _order(r):
            settings = _settings(base, f"benchcrypto_{stamp.lower()}_e2e{r}_{m}", m)
            task = bar.add_task(f"ingest round {r + 1}, {m}", total=len(events), rate="")
            try:
                run = _ingest_once(settings, events, log_dir / f"e2e{r}-{m}", bar, task)
            finally:
                if not keep:
                    drop_private(settings)
                    shutil.rmtree(settings.data_dir / "faust" / settings.processor_group, ignore_errors=True)
            per_round[m].append(run["applied_s"])
            cpu[m].append(run["worker_cpu_s"])
            n = len(events)
            projected = run.pop("projected")
            runs.append(
                {
                    "round": r + 1,
                    "mode": m,
                    **{k: round(v, 3) for k, v in run.items()},
                    "projected": projected,
                    "events_per_s": round(n / run["applied_s"], 1),
                    # the worker's own pace: from its first applied batch of the dataset to its last
                    "projection_events_per_s": round(
                        (n - run["applied_at_first"]) / max(run["applied_s"] - run["first_applied_s"], 1e-6), 1
                    ),
                }
            )
    out = {**_summary(per_round, len(events)), **_cpu_part(cpu, len(events))}  # CPU: the worker process's
    proj = {m: statistics.median(x["projection_events_per_s"] for x in runs if x["mode"] == m) for m in MODES}
    out["median_projection_events_per_s"] = {m: round(v, 1) for m, v in proj.items()}
    out["projection_ratio_on_off"] = round(proj["on"] / proj["off"], 4)
    out["runs"] = runs
    # a faster mode that projected less (dead letters, skipped records) would be no result: all must agree
    same = {_projection_key(x["projected"], ("events", "fact_versions", "dead_letters")) for x in runs}
    out["same_projection_in_every_run"] = len(same) == 1
    out["sealed_events_on"] = sorted({x["projected"]["sealed_events"] for x in runs if x["mode"] == "on"})
    return out


def _projection_key(d: dict[str, int], keys: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(d[k] for k in keys)


def _markdown(res: dict[str, Any]) -> str:
    p, e, s = res["publish"], res["ingest"], res["seal_open"]
    mo = res["machine"]
    lines = [
        f"# Encryption cost, {res['started']}",
        "",
        f"`{res['command']}`: {res['dataset']['events']:,} events over {res['dataset']['subjects']:,} subjects; "
        f"publish: warm-up + {res['rounds']['publish']} rounds per mode, ingest: {res['rounds']['ingest']} rounds "
        "per mode (fresh names and a real worker each), off/on interleaved in alternating order.",
        f"Machine: {mo['cpu_model']}, {mo['cores']} cores; load average at start {res['load_average_start']}, "
        f"at end {res['load_average_end']} (shared with other work).",
        "",
        "| measure | off | on | on/off | cost |",
        "|---|---|---|---|---|",
        f"| publish, SDK (events/s, median) | {p['median_events_per_s']['off']:,.0f} | "
        f"{p['median_events_per_s']['on']:,.0f} | {p['ratio_on_off']:.3f} | {p['cost_pct']}% |",
        f"| end-to-end ingest, publish -> applied in PostgreSQL (events/s, median) | "
        f"{e['median_events_per_s']['off']:,.0f} | {e['median_events_per_s']['on']:,.0f} | "
        f"{e['ratio_on_off']:.3f} | {e['cost_pct']}% |",
        f"| projection alone, worker's first to last batch (events/s, median) | "
        f"{e['median_projection_events_per_s']['off']:,.0f} | {e['median_projection_events_per_s']['on']:,.0f} | "
        f"{e['projection_ratio_on_off']:.3f} | {round((1 - e['projection_ratio_on_off']) * 100, 1)}% |",
        "",
        "CPU per event (median; less sensitive to the other work on the machine than events/s):",
        "",
        "| process | off µs | on µs | on/off |",
        "|---|---|---|---|",
        f"| publishing (this process: SDK + kafka-python) | {p['median_cpu_us_per_event']['off']} | "
        f"{p['median_cpu_us_per_event']['on']} | {p['cpu_ratio_on_off']:.3f} |",
        f"| worker (`ledger worker`, publish -> applied) | {e['median_cpu_us_per_event']['off']} | "
        f"{e['median_cpu_us_per_event']['on']} | {e['cpu_ratio_on_off']:.3f} |",
        "",
        f"Paired on/off ratios per round: publish {p['paired_ratios']}, ingest {e['paired_ratios']}.",
        f"Every ingest run projected the same (events, fact versions, dead letters): "
        f"{e['same_projection_in_every_run']}; {e['runs'][0]['projected']} in the first run; sealed events "
        f"stored with encryption on: {e['sealed_events_on']}.",
        f"Target: encryption costs <= 10% of end-to-end ingest: **{'met' if e['cost_pct'] <= 10 else 'missed'}** "
        f"({e['cost_pct']}%).",
        "",
        f"Per event, in process (best of 5 over {s['events']:,} events; record {s['clear_bytes_mean']:.0f} B clear, "
        f"{s['sealed_bytes_mean']:.0f} B sealed):",
        "",
        "| step | clear µs | sealed µs | added µs |",
        "|---|---|---|---|",
        f"| encode (`contract.encode` / `envelope.encode_sealed`) | {s['encode_us']} | {s['encode_sealed_us']} | "
        f"{s['seal_added_us']} |",
        f"| decode (`decode_record` / + `open_record` {s['open_record_us']} µs) | {s['decode_clear_us']} | "
        f"{round(s['decode_sealed_us'] + s['open_record_us'], 2)} | {s['open_added_us']} |",
        "",
    ]
    return "\n".join(lines)


def crypto_command(
    events: int = typer.Option(20_000, help="events in the dataset (bench.dataset)"),
    subjects: int = typer.Option(2_000, help="subjects in the dataset"),
    rounds: int = typer.Option(3, help="timed publish rounds per mode (after one warm-up round)"),
    ingest_rounds: int = typer.Option(3, help="end-to-end ingest rounds per mode (a fresh worker each)"),
    micro: int = typer.Option(5_000, help="events timed one by one for the seal and open costs"),
    seed: int = typer.Option(7, help="dataset seed"),
    keep: bool = typer.Option(False, help="keep the private topics, schemas and key stores"),
    out_dir: Path | None = typer.Option(None, help="results folder (default bench/results)"),
) -> None:
    """The cost of encryption: seal/open per event, SDK publish and end-to-end ingest, off vs on in one run."""
    import sys

    import orjson
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from bench.dataset import generate
    from bench.machine import code_version, load_average, machine_info
    from bench.services import drop_private
    from producers.settings import REPO_ROOT, get_settings

    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = get_settings()
    console = Console()
    data = list(generate(events, subjects, seed=seed, tenants=(TENANT,)))
    res: dict[str, Any] = {
        "started": started,
        "command": "python -m bench crypto " + " ".join(sys.argv[2:]),
        "dataset": {"events": len(data), "subjects": subjects, "seed": seed},
        "rounds": {"publish": rounds, "ingest": ingest_rounds},
        "machine": machine_info(base),
        "code": code_version(),
        "load_average_start": load_average(),
        "key_cache_ttl_s": base.key_cache_ttl_s,
        "target": "encryption costs <= 10% of end-to-end ingest throughput",
    }
    with console.status(f"seal and open, {min(micro, len(data)):,} events"):
        res["seal_open"] = seal_open_cost(data, micro)
    console.print(f"seal/open per event: {res['seal_open']}")
    columns = (
        TextColumn("{task.description:<34}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>10}"),
        TimeElapsedColumn(),
    )
    log_dir = base.log_dir / f"bench-crypto-{started}"  # .data: git-ignored
    pub = {m: _settings(base, f"benchcrypto_{started.lower()}_pub_{m}", m) for m in MODES}
    with Progress(*columns, console=console) as bar:
        try:
            res["publish"] = publish_cost(pub, data, rounds, bar)
        finally:
            if not keep:
                for s in pub.values():
                    drop_private(s)
        res["ingest"] = ingest_cost(base, started, data, ingest_rounds, bar, log_dir, keep)
    res["load_average_end"] = load_average()
    out = out_dir or REPO_ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"crypto-{started}.json").write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    md = _markdown(res)
    (out / f"crypto-{started}.md").write_text(md)
    console.print(md)
    console.print(f"wrote {out / f'crypto-{started}.json'} and .md")

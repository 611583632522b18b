"""The SDK at the producer's pace: `LedgerProducer` publishing events against kafka-python producing their bytes.

Both send the same events, with the same keys, to a fresh topic of 6 partitions each time, acks=all and
idempotent, in the same process, in alternating rounds (raw, SDK, raw, SDK, ...), so the ratio compares them under
the same load:

- raw: `bench.raw.bench_kafka_produce` of the records already encoded (nothing of ours is timed);
- SDK: `bench.loader.publish_events` of the events as dicts (`send_many` in chunks of 2,000, as a service would):
  each event validated once, encoded, fingerprinted for the event_id check, sent, its acknowledgement awaited.

`ratio` is the median of the per-round ratios (SDK events/s over raw events/s); target >= 0.5. CPU per event is this
process's (the caller's thread and kafka-python's sender thread): it is less disturbed by a shared machine than the
wall time. `python -m bench run` measures it in its raw step; `python -m bench publish` alone.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

__all__ = ["TARGET", "compare_publish", "publish_command"]

TARGET = 0.5  # SDK publish >= half of raw kafka-python produce, in the same run


def _sdk_round(s: Any, events: Sequence[dict]) -> tuple[float, float]:
    """(events/s, CPU µs per event) of the SDK publishing `events` to a topic of its own, then dropped."""
    from kafka import KafkaAdminClient

    from bench.loader import publish_events
    from producers.kafka_producer import kafka_connection
    from producers.sdk import LedgerProducer

    name = f"bench-sdk-{uuid.uuid4().hex[:8]}"
    own = s.model_copy(update={"topic": f"{name}.events", "dlq_topic": f"{name}.dlq", "access_topic": f"{name}.access"})
    producer = LedgerProducer(own).connect()  # the raw producer, too, connects before its clock starts
    try:
        cpu0 = time.process_time()
        seconds = publish_events(own, events, producer=producer)
        cpu = time.process_time() - cpu0
    finally:
        producer.close()
        admin = KafkaAdminClient(**kafka_connection(s))
        try:
            admin.delete_topics([own.topic, own.dlq_topic, own.access_topic])
        finally:
            admin.close()
    return len(events) / seconds, cpu / len(events) * 1e6


def compare_publish(s: Any, events: Sequence[dict], rounds: int = 3) -> dict[str, Any]:
    """Raw kafka-python produce and SDK publish of the same events (`s`: Settings), alternating `rounds` rounds."""
    from bench.raw import bench_kafka_produce
    from producers.contract import encode, from_dict

    payloads = [(ev.kafka_key, encode(ev)) for ev in (from_dict(e) for e in events)]
    per_round: list[dict[str, float]] = []
    for _ in range(rounds):
        cpu0 = time.process_time()
        raw = bench_kafka_produce(s, payloads)
        raw_cpu = (time.process_time() - cpu0) / len(payloads) * 1e6
        sdk, sdk_cpu = _sdk_round(s, events)
        per_round.append(
            {
                "raw_per_s": raw["per_s"],
                "sdk_per_s": round(sdk, 1),
                "ratio": round(sdk / raw["per_s"], 3),
                "raw_cpu_us": round(raw_cpu, 1),
                "sdk_cpu_us": round(sdk_cpu, 1),
            }
        )
    med = {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}
    return {
        "events": len(events),
        "rounds": per_round,
        "raw_per_s": round(med["raw_per_s"], 1),
        "sdk_per_s": round(med["sdk_per_s"], 1),
        "ratio": round(med["ratio"], 3),  # the median of the per-round ratios
        "raw_cpu_us_per_event": round(med["raw_cpu_us"], 1),
        "sdk_cpu_us_per_event": round(med["sdk_cpu_us"], 1),
        "target": TARGET,
    }


def publish_command(
    events: int = typer.Option(20_000, help="events in the dataset (bench.dataset)"),
    subjects: int = typer.Option(2_000, help="subjects in the dataset"),
    rounds: int = typer.Option(3, help="alternating rounds: raw produce, then SDK publish"),
    seed: int = typer.Option(7, help="dataset seed"),
    out_dir: Path | None = typer.Option(None, help="results folder (default bench/results)"),
) -> None:
    """SDK publish vs raw kafka-python produce of the same events, in one run (bench/publish.py)."""
    import orjson

    from bench.dataset import generate
    from bench.machine import code_version, load_average
    from bench.run import RESULTS
    from producers.settings import get_settings

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    s = get_settings()
    data = list(generate(events, subjects, seed=seed, tenants=("bench",)))
    load_start = load_average()
    result = compare_publish(s, data, rounds)
    for i, r in enumerate(result["rounds"], 1):
        typer.echo(
            f"round {i}: raw {r['raw_per_s']:,.0f}/s, SDK {r['sdk_per_s']:,.0f}/s, ratio {r['ratio']:.3f} "
            f"(CPU per event: raw {r['raw_cpu_us']:.0f} µs, SDK {r['sdk_cpu_us']:.0f} µs)"
        )
    verdict = "met" if result["ratio"] >= TARGET else "missed"
    typer.echo(f"SDK publish / raw kafka-python produce: {result['ratio']:.3f} (median; target >= {TARGET}): {verdict}")
    folder = out_dir or RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"publish-{stamp}.json"
    record = {
        "stamp": stamp,
        "config": {"events": events, "subjects": subjects, "rounds": rounds, "seed": seed},
        "code": code_version(),
        "load_average_start": load_start,
        "load_average_end": load_average(),
        **result,
    }
    path.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    typer.echo(f"results: {path}")

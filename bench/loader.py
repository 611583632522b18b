"""Publish a bench.dataset through the producer SDK, the way a service would, and wait until it is queryable."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from bench.catchup import Probe, wait_caught_up
from bench.dataset import generate
from producers.sdk import LedgerProducer, PublishError
from producers.settings import Settings

__all__ = ["load_dataset", "publish_events"]

CHUNK = 2000


def publish_events(
    settings: Settings,
    events: Sequence[dict],
    *,
    producer: LedgerProducer | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> float:
    """Publish all events (send_many in chunks, acks=all); returns seconds. Raises on any failed event."""
    own = producer is None
    producer = producer or LedgerProducer(settings)
    t0 = time.perf_counter()
    try:
        for i in range(0, len(events), CHUNK):
            chunk = events[i : i + CHUNK]
            failed = [o for o in producer.send_many(chunk) if isinstance(o, PublishError)]
            if failed:
                raise failed[0]
            if on_chunk:
                on_chunk(len(chunk))
    finally:
        if own:
            producer.close()
    return time.perf_counter() - t0


def load_dataset(settings: Settings, n_events: int, n_subjects: int, *, tenant: str, timeout: float) -> dict:
    """Publish a dataset and wait until PostgreSQL and Elasticsearch hold all of it, vectors too (a worker, an
    indexer and an embedder run)."""
    events = list(generate(n_events, n_subjects, tenants=(tenant,)))
    seconds = publish_events(settings, events)
    probe = Probe(settings)
    try:
        pg_s, es_s, vec_s = wait_caught_up(probe, timeout=timeout)
    finally:
        probe.close()
    return {
        "events": len(events),
        "publish_s": seconds,
        "pg_caught_up_s": pg_s,
        "es_caught_up_s": es_s,
        "vectors_caught_up_s": vec_s,
    }

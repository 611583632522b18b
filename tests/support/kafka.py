"""The ledger topic from a test's side: publish (through the SDK or raw), read back, drop.

- `publish(settings, events)`: through the SDK (creates the topics); the PublishResults.
- `publish_raw(settings, [(key, bytes)])`: the records as they are, like a non-SDK client.
- `read_topic(settings, topic=None)`: every record from offset 0 to the end offsets (no group).
- `dlq_envelopes(settings, want=..., count=...)`: the dead-letter topic's envelopes by the original
  record's (partition, offset), once the wanted ones are there.
- `drop_topics(settings, *names)`; `end_offsets` is the product's (`producers.topics`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from producers.contract import MemoryEvent
from producers.kafka_producer import kafka_connection
from producers.sdk import LedgerProducer
from producers.settings import Settings
from producers.topics import end_offsets, ensure_topics
from tests.support.waiting import wait_for

__all__ = ["dlq_envelopes", "drop_topics", "end_offsets", "publish", "publish_raw", "read_topic"]


def publish(settings: Settings, events: Iterable[MemoryEvent | dict]) -> list:
    """Publish through the SDK (creates the topics); returns the PublishResults."""
    with LedgerProducer(settings) as producer:
        return producer.publish_many(list(events))


def publish_raw(
    settings: Settings, records: Sequence[tuple[bytes | None, bytes | None]], *, topic: str | None = None
) -> list[tuple[int, int]]:
    """Write (key, value) records as they are, like a non-SDK client, to the ledger topic (or `topic`, one of the
    settings' three); returns (partition, offset) each."""
    ensure_topics(settings)
    producer = KafkaProducer(**kafka_connection(settings), acks="all", linger_ms=5)
    try:
        futures = [producer.send(topic or settings.topic, key=k, value=v) for k, v in records]
        producer.flush(30)
        return [(m.partition, m.offset) for m in (f.get(30) for f in futures)]
    finally:
        producer.close(5)


def read_topic(settings: Settings, topic: str | None = None, timeout_s: float = 60.0) -> list[Any]:
    """Every record on `topic` (default: the ledger topic) from offset 0 to the end offsets (no consumer group)."""
    topic = topic or settings.topic
    consumer = KafkaConsumer(
        **kafka_connection(settings), enable_auto_commit=False, group_id=None, consumer_timeout_ms=1000
    )
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = end_offsets(settings, topic, consumer=consumer)
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp.partition] for tp in parts):
            assert time.monotonic() < deadline, f"could not read to the end offsets {end} in {timeout_s}s"
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def dlq_envelopes(
    settings: Settings,
    *,
    want: Iterable[tuple[int, int]] = (),
    count: int = 0,
    timeout: float = 30.0,
) -> dict[tuple[int, int], dict]:
    """The DLQ topic's envelopes by (partition, offset) of the original record, once every `want` and at least
    `count` of them are there."""
    wanted = set(want)

    def arrived() -> dict[tuple[int, int], dict] | None:
        got = {}
        for record in read_topic(settings, settings.dlq_topic, timeout_s=timeout):
            body = orjson.loads(record.value)
            got[(body["partition"], body["offset"])] = body
        return got if wanted <= set(got) and len(got) >= count else None

    return wait_for(arrived, timeout, 0.5, f"{max(len(wanted), count)} dead letters on {settings.dlq_topic}")


def drop_topics(settings: Settings, *names: str) -> None:
    """Delete `names` (default: the ledger topic, its DLQ and the access topic) if they exist."""
    admin = KafkaAdminClient(**kafka_connection(settings))
    try:
        existing = set(admin.list_topics())
        doomed = [n for n in (names or (settings.topic, settings.dlq_topic, settings.access_topic)) if n in existing]
        if doomed:
            admin.delete_topics(doomed)
    finally:
        admin.close()

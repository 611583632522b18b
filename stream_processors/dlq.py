"""The dead-letter sink: copy refused ledger records to `settings.dlq_topic` with their reason.

Three kinds of record arrive here, told apart by `code`: a record the contract refuses (its
InvalidEvent code: `bad_json`, `too_large`, `unstorable_text`, ...), a valid event PostgreSQL or
the pure core can never store (`unstorable`: the database's message, e.g. a constraint or a data
exception, with the column as `field` when PostgreSQL names one), and a same-tenant re-use of
an event_id for other content (`event_id_conflict`, field `event_id`; the original is kept).

Record format (one JSON object, orjson): `{"code", "field", "message", "topic", "partition",
"offset", "timestamp_ms", "key_b64", "raw_b64", "raw_bytes", "raw_truncated"}`. The original
bytes are base64 in `raw_b64` (cut at MAX_RAW_IN_DLQ so the envelope fits the topic's
max.message.bytes; the full bytes stay in `dead_letters.raw` and in the ledger at their offset).
The Kafka key is the original key. Headers repeat the reason for tools that only read headers.
Delivery is at-least-once (sent and acknowledged before the batch's PostgreSQL commit); the
`dead_letters` table counts each (topic, partition, offset) exactly once.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import orjson
from kafka import KafkaProducer

from producers.kafka_producer import kafka_producer
from producers.records import DeadLetter
from producers.settings import Settings

__all__ = ["DlqProducer", "envelope"]

MAX_RAW_IN_DLQ = 512 * 1024


def envelope(letter: DeadLetter) -> dict[str, Any]:
    r = letter.record
    raw = r.raw or b""
    cut = raw[:MAX_RAW_IN_DLQ]
    ts = None if r.timestamp is None else round(r.timestamp.timestamp() * 1000)
    return {
        **letter.error.as_dict(),
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp_ms": ts,
        "key_b64": None if r.key is None else base64.b64encode(r.key).decode(),
        "raw_b64": None if r.raw is None else base64.b64encode(cut).decode(),
        "raw_bytes": len(raw),
        "raw_truncated": len(cut) < len(raw),
    }


class DlqProducer:
    """Synchronous sink for the recorder: returns only when the broker has every record (acks=all)."""

    def __init__(self, settings: Settings, *, timeout_s: float = 30.0) -> None:
        self.topic = settings.dlq_topic
        self.timeout_s = timeout_s
        self._settings = settings
        self._producer: KafkaProducer | None = None

    def __call__(self, letters: Sequence[DeadLetter]) -> None:
        if self._producer is None:
            self._producer = kafka_producer(self._settings, client_id="memory-ledger-dlq", max_request_size=1024 * 1024)
        futures = []
        for letter in letters:
            body = envelope(letter)
            headers = [
                ("ledger.error.code", body["code"].encode()),
                ("ledger.error.field", (body["field"] or "").encode()),
                ("ledger.source", f"{body['topic']}/{body['partition']}/{body['offset']}".encode()),
            ]
            value = orjson.dumps(body)
            futures.append(self._producer.send(self.topic, value=value, key=letter.record.key, headers=headers))
        self._producer.flush(timeout=self.timeout_s)
        for f in futures:
            f.get(timeout=self.timeout_s)  # raises: the batch rolls back and is retried

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None

"""The dead-letter sink: copy refused ledger records to `settings.dlq_topic` with their reason.

A record arrives here refused by the contract, unstorable by PostgreSQL (`unstorable`), or re-using an event_id for
other content (`event_id_conflict`); `code` tells which. The original bytes are cut at MAX_RAW_IN_DLQ so the
envelope fits the topic (the full bytes stay in `dead_letters.raw` and the ledger); headers repeat the reason for
tools that read only headers. At least once: sent before the batch's commit. Format: docs/INTERNALS.md.
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

"""Access tracking on the API's side: every memory recall or context serves, recorded off the request path.

    res.access.served(tenant, caller_of(tenants), hits)          # after the response body is built

A request only appends to a bounded queue; a thread hands the accesses to the access topic (never the ledger's).
Accesses are observations, not memories: recording is best effort and never fails or slows a read (what cannot be
sent is dropped and counted), and the access id makes a redelivery one access. The caller is a fingerprint of the
API key, never the key itself.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaProducer

from producers.contract import AccessEvent, InvalidEvent, access_id_for, access_key, encode_access
from producers.kafka_producer import kafka_producer
from producers.logs import current_ids
from producers.metrics import counter
from producers.settings import Settings

__all__ = ["AccessRecorder", "CallerTenants", "caller_id", "caller_of"]

log = logging.getLogger(__name__)

RECORDED = counter("access_recorded_total", "Accesses (memories served by recall or context) the broker acknowledged")
DROPPED = counter(
    "access_dropped_total",
    "Accesses not recorded, by reason: queue_full (the flush fell behind), unavailable (no broker, or the access "
    "topic did not answer), delivery (the broker did not acknowledge), invalid (not a valid access event)",
    ("reason",),
)
_REASONS = ("queue_full", "unavailable", "delivery", "invalid")
for _reason in _REASONS:
    DROPPED.labels(_reason)  # shown at 0 before the first drop


@functools.lru_cache(maxsize=256)
def caller_id(api_key: str) -> str:
    """A stable fingerprint of an API key: the same key always gives the same id, and the id never gives the key.

    A plain digest of a guessable key could be reversed by trying candidates; production keys are long random
    strings, for which it cannot. The label is what the access records and the projection keep as `caller`.
    """
    return "key:" + hashlib.sha256(b"memory-ledger api key\x00" + api_key.encode()).hexdigest()[:16]


class CallerTenants(frozenset[str]):
    """The tenants an API key may use (a frozenset, as the routes check them) and `caller`, the key's fingerprint."""

    __slots__ = ("caller",)
    caller: str

    def __new__(cls, tenants: Iterable[str], caller: str) -> CallerTenants:
        obj = super().__new__(cls, tenants)
        obj.caller = caller
        return obj


def caller_of(tenants: frozenset[str]) -> str:
    """The caller's fingerprint, from what api.deps handed the route ("unknown" for a plain frozenset)."""
    return getattr(tenants, "caller", "unknown")


def _stage(hit: Mapping[str, Any]) -> str:
    stage = hit.get("stage")
    if stage is None:
        match = hit.get("match")
        stage = match.get("stage") if isinstance(match, Mapping) else None
    return stage or "unknown"


Serving = tuple[str, str, str | None, str, datetime, tuple[tuple[str, str, str], ...]]


class AccessRecorder:
    """The API process's one access recorder: `served` on the request path, a flush thread behind it."""

    def __init__(self, settings: Settings, *, enabled: bool | None = None) -> None:
        self.settings = settings
        self.enabled = settings.access_recording if enabled is None else enabled
        self.topic = settings.access_topic
        self._queue: deque[Serving] = deque()
        self._max = max(1, settings.access_queue_size)
        self._lock = threading.Lock()  # the counters are written by the loop, the flush and the sender threads
        self._flushing = threading.Lock()  # one flush at a time (the thread's, or a caller's `flush`)
        self.recorded = 0
        self.dropped = 0
        self.dropped_by: dict[str, int] = dict.fromkeys(_REASONS, 0)
        self._producer: KafkaProducer | None = None
        self._retry_at = 0.0  # monotonic time before which no new connection is tried (the broker was away)
        self._backoff = 0.5
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the request path ------------------------------------------------------------------------------------------
    def served(
        self,
        tenant: str,
        caller: str,
        hits: Iterable[Mapping[str, Any]],
        *,
        via: str = "recall",
        request_id: str | None = None,
    ) -> None:
        """Record that `hits` (each with memory_id, version_id and a stage: `stage` or `match.stage`) were served
        to `caller` in `tenant` by `via` (recall | context). Never raises, never blocks; a few microseconds."""
        if not self.enabled:
            return
        served = tuple((h["memory_id"], h["version_id"], _stage(h)) for h in hits)
        if not served:
            return
        if len(self._queue) >= self._max:
            self._drop("queue_full", len(served))
            return
        rid = request_id if request_id is not None else current_ids().get("request_id")
        self._queue.append((tenant, caller, rid, via, datetime.now(UTC), served))

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> AccessRecorder:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="access-flush", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout_s: float | None = None) -> None:
        """Flush what is queued (bounded), then stop the thread and the producer."""
        timeout = self.settings.api_kafka_timeout_s if timeout_s is None else timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout + 1.0)
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close(timeout=timeout)
            except Exception:  # noqa: BLE001 - shutting down: nothing left to save
                log.warning("access producer did not close cleanly", exc_info=True)

    @property
    def pending(self) -> int:
        """Servings queued and not yet handed to the producer."""
        return len(self._queue)

    def flush(self) -> None:
        """Hand everything queued to the producer now and wait (bounded) for the broker's answers (tests, shutdown)."""
        self._flush()
        if self._producer is not None:
            try:
                self._producer.flush(timeout=self.settings.api_kafka_timeout_s)
            except Exception:  # noqa: BLE001 - undelivered records are counted by their errbacks
                log.warning("access producer flush did not complete", exc_info=True)

    # -- the flush thread ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.settings.access_flush_s):
            self._flush_safely()
        self._flush_safely()

    def _flush_safely(self) -> None:
        try:
            self._flush()
        except Exception:  # noqa: BLE001 - a bug here must not kill the thread: what was taken is lost, and counted
            log.exception("access flush failed")

    def _flush(self) -> None:
        with self._flushing:
            self._drain()

    def _drain(self) -> None:
        while self._queue:
            servings: list[Serving] = []
            while self._queue and len(servings) < self.settings.access_batch_size:
                servings.append(self._queue.popleft())
            records = self._records(servings)
            if records:
                self._send(records)

    def _records(self, servings: list[Serving]) -> list[tuple[bytes, bytes]]:
        out = []
        for tenant, caller, rid, via, at, served in servings:
            serving = rid or uuid.uuid4().hex
            for memory_id, version_id, stage in served:
                try:
                    event = AccessEvent(
                        access_id=access_id_for(tenant, caller, serving, memory_id, version_id),
                        tenant=tenant,
                        memory_id=memory_id,
                        version_id=version_id,
                        stage=stage,
                        via=via,
                        caller=caller,
                        request_id=rid,
                        accessed_at=at,
                    )
                except (InvalidEvent, ValueError):  # pydantic's ValidationError is a ValueError
                    self._drop("invalid", 1)
                    continue
                out.append((access_key(tenant, memory_id), encode_access(event)))
        return out

    def _send(self, records: list[tuple[bytes, bytes]]) -> None:
        producer = self._connected()
        if producer is None:
            self._drop("unavailable", len(records))
            return
        for i, (key, value) in enumerate(records):
            try:  # blocks (this thread only) while the topic's metadata or buffer space is missing, bounded
                future = producer.send(self.topic, key=key, value=value)
            except Exception as exc:  # noqa: BLE001 - the broker or the topic is away: drop the rest, count them
                log.warning("access records dropped: %s: %s", type(exc).__name__, exc)
                self._drop("unavailable", len(records) - i)
                self._back_off()  # the next flushes drop at once instead of blocking again
                return
            future.add_callback(self._acked).add_errback(self._failed)

    def _back_off(self) -> None:
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, 30.0)

    def _connected(self) -> KafkaProducer | None:
        if time.monotonic() < self._retry_at:
            return None
        if self._producer is not None:
            return self._producer
        timeout_ms = max(1000, int(self.settings.api_kafka_timeout_s * 1000))
        try:
            producer = kafka_producer(
                self.settings,
                client_id="memory-ledger-access",
                durable=False,  # an observation: one replica's ack; a redelivery is deduplicated by the access id
                retries=3,
                linger_ms=50,
                batch_size=64 * 1024,
                allow_auto_create_topics=False,  # created by producers.topics.ensure_topics, never by accident
                timeout_ms=timeout_ms,
            )
        except Exception as exc:  # noqa: BLE001 - any failure to connect: drop, and try again after a backoff
            log.warning("access producer cannot connect to %s: %s: %s", self.settings.kafka_bootstrap, type(exc), exc)
            self._back_off()
            return None
        self._producer = producer
        return producer

    def _acked(self, _metadata: object) -> None:
        with self._lock:
            self.recorded += 1
        self._backoff = 0.5  # the broker and the topic answer again
        RECORDED.inc()

    def _failed(self, exc: BaseException) -> None:
        log.debug("access record not delivered: %r", exc)
        self._drop("delivery", 1)

    def _drop(self, reason: str, n: int) -> None:
        with self._lock:
            self.dropped += n
            self.dropped_by[reason] += n
        DROPPED.labels(reason).inc(n)

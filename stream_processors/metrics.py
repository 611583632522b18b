"""The projector worker's metrics (docs/metrics.md), served by `producers.metrics.serve` on LEDGER_WORKER_METRICS_PORT.

Counted once per committed batch from its `BatchResult`, so a number here is what this process committed to
PostgreSQL: `records_total` by what each record did, dead letters by their reason code (the DLQ's `code`).
The consumer lag of each partition this worker is assigned is the broker's high watermark, as of the consumer's
last fetch, less the next offset stored in PostgreSQL after this worker's last batch (or read at assignment):
set after every batch and every `metrics_refresh_s` (a partition revoked from this worker loses its series).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import psycopg
from faust.types import TP

from producers.metrics import BATCH_BUCKETS, counter, gauge, histogram
from producers.settings import Settings
from projections.postgres.dead_letters import STATES, dead_letter_states
from projections.postgres.positioned import connect
from projections.postgres.recorder import BatchResult

__all__ = ["DeadLetterGauge", "LagGauge", "record_batch", "record_retry"]

log = logging.getLogger(__name__)

RECORDS = counter(
    "worker_records_total",
    "Ledger records the projector consumed, by outcome: applied (a new event), duplicate (a redelivery, no "
    "effect), erased_replay (an event of an erased subject, no effect), skipped (below the stored position), "
    "dead_letter (sent to the DLQ)",
    ("outcome",),
)
DEAD_LETTERS = counter(
    "worker_dead_letters_total",
    "Records dead-lettered by the projector, by reason (the DLQ code: bad_json, missing_field, unstorable, "
    "event_id_conflict, ...)",
    ("reason",),
)
BATCH_SECONDS = histogram(
    "worker_batch_duration_seconds",
    "Time from a batch taken off the stream to its PostgreSQL commit, retries included",
    buckets=BATCH_BUCKETS,
)
RETRIES = counter(
    "worker_batch_retries_total",
    "Batches (of the ledger or the access topic) retried after a transient failure, by cause (postgres, dlq: the "
    "DLQ topic, other)",
    ("cause",),
)
LAG = gauge(
    "worker_consumer_lag",
    "Records of a partition assigned to this worker not yet applied: high watermark minus stored position",
    ("topic", "partition"),
)

DEAD_LETTER_STATES = gauge(
    "worker_dead_letters_by_state",
    "Dead letters of the ledger topic in PostgreSQL by state: open, redriven (a corrected event applied), "
    "discarded (closed with a reason); every tenant's, read every LEDGER_METRICS_REFRESH_S",
    ("state",),
)

_OUTCOMES = {name: RECORDS.labels(name) for name in ("applied", "duplicate", "erased_replay", "skipped", "dead_letter")}
for _cause in ("postgres", "dlq", "other"):
    RETRIES.labels(_cause)  # shown at 0 before the first retry, so a rate() sees the first one


def record_batch(result: BatchResult, seconds: float) -> None:
    """One committed batch (microseconds: a few locked adds)."""
    for outcome, n in (
        ("applied", result.applied),
        ("duplicate", result.duplicates),
        ("erased_replay", result.erased_replays),
        ("skipped", result.skipped),
        ("dead_letter", result.dead),
    ):
        if n:
            _OUTCOMES[outcome].inc(n)
    for reason, n in result.dead_codes.items():
        DEAD_LETTERS.labels(reason).inc(n)
    BATCH_SECONDS.observe(seconds)


def record_retry(cause: str) -> None:
    RETRIES.labels(cause).inc()


class LagGauge:
    """`ledger_worker_consumer_lag{topic, partition}` of one topic, from the positions this worker knows."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.next_offsets: dict[int, int] = {}  # partition -> next offset stored in PostgreSQL
        self._shown: set[int] = set()

    def positions(self, next_offsets: Mapping[int, int]) -> None:
        """Positions read at assignment or committed by a batch."""
        self.next_offsets.update(next_offsets)

    def refresh(self, consumer) -> None:
        """Set the lag of every assigned partition whose high watermark is known; forget revoked ones.

        `consumer` is the faust app's consumer; called from the event loop. Never raises (a metric never stops
        the worker): during a rebalance the consumer may refuse, and the next refresh tries again.
        """
        try:
            assigned = {tp.partition for tp in consumer.assignment() if tp.topic == self.topic}
            for p in self._shown - assigned:
                LAG.remove(self.topic, str(p))
                self.next_offsets.pop(p, None)
            self._shown &= assigned
            for p in assigned:
                position = self.next_offsets.get(p)
                highwater = consumer.highwater(TP(self.topic, p))
                if position is None or highwater is None:
                    continue  # not fetched yet
                LAG.labels(self.topic, str(p)).set(max(highwater - position, 0))
                self._shown.add(p)
        except Exception as exc:  # noqa: BLE001 - a metric never stops the worker; the next refresh tries again
            log.debug("consumer lag not refreshed: %r", exc)


class DeadLetterGauge:
    """`ledger_worker_dead_letters_by_state{state}`: the dead-letter workflow's counts, from PostgreSQL (the workflow's
    actions are events any worker may apply, so the counts are read, not counted here). One connection of its own,
    opened on first use and again after a failure; `refresh` runs off the event loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._conn: psycopg.Connection | None = None
        for state in STATES:
            DEAD_LETTER_STATES.labels(state)  # shown at 0 before the first read

    def refresh(self) -> None:
        """Read the counts; never raises (a metric never stops the worker: the next refresh tries again)."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.settings.pg_dsn, self.settings.pg_schema, autocommit=True)
            for state, n in dead_letter_states(self._conn, self.settings.topic).items():
                DEAD_LETTER_STATES.labels(state).set(n)
        except Exception as exc:  # noqa: BLE001 - a metric never stops the worker; the next refresh tries again
            log.debug("dead-letter counts not refreshed: %r", exc)
            self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

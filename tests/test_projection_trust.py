"""The projector under bad and hostile input (issue 10): real Kafka, real PostgreSQL, the worker as a subprocess.

- Poison records (class 1): a record PostgreSQL refuses is dead-lettered as `unstorable` and the
  records after it in the same batch are applied; the partition never stops.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import orjson
import psycopg
import pytest
from kafka import KafkaConsumer
from psycopg import errors as pg_errors

from infra.settings import Settings
from producers.contract import InvalidEvent, MemoryEvent, encode, kafka_key
from projections.postgres.recorder import CoreRefused, Recorder, connect, decode_record, is_permanent
from projections.postgres.schema import create_schema
from tests.conftest import unique
from tests.helpers import Worker, cleanup, end_offsets, pg, positions, publish_raw, wait_caught_up, wait_for

T0 = datetime(2026, 3, 1, tzinfo=UTC)
TENANT = "acme"


def at(days: float) -> datetime:
    return T0 + timedelta(days=days)


def asserted(subject: str, key: str, value, day: float = 0, *, tenant: str = TENANT, **kw) -> MemoryEvent:
    return MemoryEvent(
        type="memory.asserted",
        tenant=tenant,
        subject=subject,
        key=key,
        value=value,
        content=kw.pop("content", f"{subject} {key} = {value}"),
        valid_from=at(day),
        observed_at=kw.pop("observed_at", at(day)),
        **kw,
    )


def mark(type_: str, subject: str, key: str, day: float, *, tenant: str = TENANT, **kw) -> MemoryEvent:
    return MemoryEvent(
        type=type_, tenant=tenant, subject=subject, key=key, valid_from=at(day), observed_at=at(day), **kw
    )


def dlq_bodies(settings: Settings, want: set[tuple[int, int]], timeout: float = 30) -> dict[tuple[int, int], dict]:
    """The DLQ topic's envelopes by (partition, offset) of the original record, once `want` are all there."""
    consumer = KafkaConsumer(
        settings.dlq_topic,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        consumer_timeout_ms=2000,
    )
    got: dict[tuple[int, int], dict] = {}
    try:

        def drained() -> bool:
            for m in consumer:
                body = orjson.loads(m.value)
                got[(body["partition"], body["offset"])] = body
            return want <= set(got)

        wait_for(drained, timeout=timeout, what=f"{len(want)} dead letters on the DLQ topic")
    finally:
        consumer.close()
    return got


def dead_letters(conn: psycopg.Connection, settings: Settings) -> dict[tuple[int, int], tuple[str, str | None, str]]:
    return {
        (p, o): (code, field, message)
        for p, o, code, field, message in conn.execute(
            'SELECT "partition", "offset", code, field, message FROM dead_letters WHERE topic = %s', (settings.topic,)
        )
    }


# -- class 1: poison records ------------------------------------------------------------------------------

POISON_DDL = (
    # IntegrityError on the version COPY
    "ALTER TABLE fact_versions ADD CONSTRAINT poison_content CHECK (content NOT LIKE '%POISON%')",
    # IntegrityError on the event log (any event type: an assertion, a retraction, an erasure)
    "ALTER TABLE events ADD CONSTRAINT poison_key CHECK (key IS DISTINCT FROM 'forbidden.key')",
    "ALTER TABLE events ADD CONSTRAINT poison_erasure CHECK (type <> 'subject.erased' OR subject NOT LIKE '%refused%')",
    # DataError (22P02 invalid_text_representation) raised while checking a row
    "ALTER TABLE fact_versions ADD CONSTRAINT poison_cast CHECK (key NOT LIKE 'num.%' OR substr(key, 5)::int >= 0)",
)


@pytest.mark.unit
def test_failures_are_sorted_into_retry_and_dead_letter():
    permanent = [
        pg_errors.UntranslatableCharacter(),
        pg_errors.CheckViolation(),
        pg_errors.NotNullViolation(),
        pg_errors.UniqueViolation(),
        pg_errors.NumericValueOutOfRange(),
        pg_errors.InvalidTextRepresentation(),
        pg_errors.ProgramLimitExceeded(),
        CoreRefused("ValueError: memory.frobbed has no route"),
    ]
    transient = [
        psycopg.OperationalError("connection lost"),
        pg_errors.AdminShutdown(),
        pg_errors.DeadlockDetected(),
        pg_errors.SerializationFailure(),
        pg_errors.LockNotAvailable(),
        pg_errors.QueryCanceled(),
        psycopg.InterfaceError("closed"),
        RuntimeError("a bug is retried, never skipped"),
        TypeError("the recorder's own bug: retried, so good records are never dead-lettered by it"),
        KeyError("k"),
        ValueError("outside the pure core"),
        InvalidEvent("bad_type", "the contract's refusals are dead letters before any write, not exceptions"),
    ]
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError

    transient += [KafkaTimeoutError(), KafkaConnectionError()]
    assert [e for e in permanent if not is_permanent(e)] == []
    assert [e for e in transient if is_permanent(e)] == []


def test_poison_records_are_dead_lettered_and_the_batch_goes_on(base_settings: Settings):
    settings = base_settings.private(unique("poison"), processor_batch_size=500, processor_batch_seconds=1.0)
    s = f"user:{uuid.uuid4().hex[:8]}"
    key = kafka_key(TENANT, s)  # one key: every record in one partition, in this order
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    with pg(settings) as conn:
        for ddl in POISON_DDL:
            conn.execute(ddl)
    events: list[tuple[MemoryEvent, bool]] = []  # (event, is poison)
    for i in range(30):
        events.append((asserted(s, f"k{i}", i), False))
        if i == 8:
            events.append((asserted(s, "bio", "x", content="this one is POISON"), True))
            events.append((asserted(s, "forbidden.key", 1), True))
        if i == 12:
            events.append((asserted(s, "num.xyz", 1), True))
            events.append((asserted(s, "num.42", 42), False))  # castable: stored
        if i == 15:
            events.append((mark("memory.retracted", s, "forbidden.key", 1), True))
            events.append((mark("memory.retracted", s, "k3", 1), False))
        if i == 20:
            events.append((MemoryEvent(type="subject.erased", tenant=TENANT, subject=f"{s}:refused"), True))
            events.append((asserted(s, "late", "POISON again", content="POISON again"), True))
    placed = publish_raw(settings, [(key, encode(e)) for e, _ in events])
    assert len({p for p, _ in placed}) == 1
    poison = {po for po, (_e, bad) in zip(placed, events, strict=True) if bad}
    worker = Worker(settings).start()  # started after publishing: the records arrive as one batch
    try:
        ends = wait_caught_up(settings, timeout=60, worker=worker)
        (part,) = {p for p, _ in placed}
        assert positions(settings)[part] == ends[part] == end_offsets(settings)[part] == placed[-1][1] + 1
        with pg(settings) as conn:
            dead = dead_letters(conn, settings)
            stored = {r[0] for r in conn.execute("SELECT key FROM fact_versions WHERE subject = %s", (s,))}
            logged = conn.execute("SELECT count(*) FROM events WHERE subject = %s", (s,)).fetchone()[0]
            k3 = conn.execute("SELECT status FROM fact_versions WHERE subject = %s AND key = 'k3'", (s,)).fetchone()
        assert set(dead) == poison and {d[0] for d in dead.values()} == {"unstorable"}
        assert all(d[2] for d in dead.values())  # the database's reason
        assert any("poison_content" in d[2] for d in dead.values()) and any("22P02" in d[2] for d in dead.values())
        assert stored == {f"k{i}" for i in range(30)} | {"num.42"}  # everything around the poison applied
        assert k3 == ("retracted",) and logged == sum(1 for _e, bad in events if not bad)
        bodies = dlq_bodies(settings, poison)
        assert {po: bodies[po]["code"] for po in poison} == dict.fromkeys(poison, "unstorable")
        assert "bisecting" in worker.log()
        assert worker.alive(), worker.log()[-3000:]
    finally:
        worker.stop()
        cleanup(settings)


def test_a_transient_failure_is_retried_not_dead_lettered(base_settings: Settings):
    """A lock timeout (PostgreSQL busy) raises out of the recorder: the caller retries, nothing is dead-lettered."""
    settings = base_settings.private(unique("transient"))
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    try:
        with connect(settings.pg_dsn, settings.pg_schema) as conn, pg(settings) as other:
            recorder = Recorder(conn, consumer="c", topic=settings.topic)
            records = [
                decode_record(settings.topic, 0, i, encode(asserted("u", f"k{i}", i)), timestamp_ms=0) for i in range(3)
            ]
            recorder.apply_batch(records[:1])
            conn.execute("SET lock_timeout = '200ms'")
            conn.commit()
            with other.transaction():
                other.execute("LOCK TABLE positions IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(pg_errors.LockNotAvailable):
                    recorder.apply_batch(records)
            result = recorder.apply_batch(records)  # the lock is gone: the same batch applies
            assert (result.applied, result.skipped, result.dead) == (2, 1, 0)
            assert other.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
    finally:
        cleanup(settings)

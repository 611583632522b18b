"""The projector under bad and hostile input: real Kafka, real PostgreSQL, the worker as a subprocess.

- Poison records: a record PostgreSQL refuses is dead-lettered as `unstorable` and the
  records after it in the same batch are applied; the partition never stops.
- Idempotency by (tenant, event_id): another tenant's event with the same id is
  its own event (an erasure too); the same tenant re-using an id for other content is a conflict,
  dead-lettered as `event_id_conflict`, the original kept; an exact redelivery has no effect.
- Erasure that holds: re-sent pre-erasure events have no effect, new ones apply, a
  rebuild agrees, and LISTENers hear of the erasure once it is committed.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator

import orjson
import psycopg
import pytest
from psycopg import errors as pg_errors

from producers.contract import InvalidEvent, MemoryEvent, encode, kafka_key, version_id_for
from producers.records import decode_record
from producers.settings import Settings
from projections.postgres.connection import connect_async
from projections.postgres.idempotency import Claim, claim_events
from projections.postgres.positioned import CoreRefused, is_permanent
from projections.postgres.queries import projection_checksum
from projections.postgres.recorder import ERASURE_CHANNEL, Recorder, connect
from projections.postgres.schema import SchemaOutdated, create_schema
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.support import (
    TENANT,
    Pipeline,
    Worker,
    asserted,
    at,
    cleanup,
    dlq_envelopes,
    end_offsets,
    erased,
    marked,
    pg,
    pipeline,
    positions,
    publish,
    publish_raw,
    wait_caught_up,
    wait_for,
)

OTHER = "globex"


def dead_letters(conn: psycopg.Connection, settings: Settings) -> dict[tuple[int, int], tuple[str, str | None, str]]:
    return {
        (p, o): (code, field, message)
        for p, o, code, field, message in conn.execute(
            'SELECT "partition", "offset", code, field, message FROM dead_letters WHERE topic = %s', (settings.topic,)
        )
    }


# -- poison records ------------------------------------------------------------------------------

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
        pg_errors.CardinalityViolation(),  # rows of one batch that collide: bisecting parts them
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
    settings = base_settings.private(unique("poison"), processor_batch_size=500)
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
            events.append((marked("memory.retracted", s, "forbidden.key", 1), True))
            events.append((marked("memory.retracted", s, "k3", 1), False))
        if i == 20:
            events.append((erased(f"{s}:refused"), True))
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
        bodies = dlq_envelopes(settings, want=poison)
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


# -- idempotency and erasure against one running worker ------------------------------------------------------------


@pytest.fixture(scope="module")
def pipe(base_settings: Settings) -> Iterator[Pipeline]:
    """One worker for the module (no indexer: PostgreSQL only)."""
    settings = base_settings.private(unique("trust"), processor_batch_size=200)
    with pipeline(settings, seed=[asserted("warmup", "k", 0)], indexer=False, timeout=60) as p:
        yield p


def count(conn: psycopg.Connection, table: str, tenant: str, subject: str) -> int:
    return conn.execute(
        f"SELECT count(*) FROM {table} WHERE tenant = %s AND subject = %s", (tenant, subject)
    ).fetchone()[0]


def facts(conn: psycopg.Connection, tenant: str, subject: str) -> dict[str, object]:
    """key -> value of the subject's current versions."""
    rows = conn.execute(
        "SELECT key, value FROM fact_versions WHERE tenant = %s AND subject = %s AND status = 'active' "
        "AND valid_to IS NULL AND superseded_by IS NULL",
        (tenant, subject),
    )
    return dict(rows.fetchall())


def test_another_tenants_event_with_the_same_id_is_its_own_event(pipe: Pipeline):
    settings, worker = pipe.settings, pipe.worker
    s = f"user:{uuid.uuid4().hex[:8]}"  # the same subject name in both tenants
    x = [asserted(s, "email", "x@acme", 0), asserted(s, "phone", "111", 0), asserted(s, "city", "Paris", 0)]
    x += [marked("memory.retracted", s, "city", 1), asserted(s, "name", "Xavier", 0)]
    publish(settings, x)
    pipe.caught_up()
    # tenant Y re-uses each of X's ids: an assertion, a retraction on an assertion's id, a confirmation on a
    # retraction's id; and an erasure of Y's own subject with the id of X's first assertion (never suppressed)
    ids = [e.event_id for e in x]
    y = [
        asserted(s, "email", "y@globex", 0, tenant=OTHER, event_id=ids[1]),
        asserted(s, "phone", "222", 0, tenant=OTHER, event_id=ids[0]),
        asserted(s, "city", "Rome", 0, tenant=OTHER, event_id=ids[3]),
        marked("memory.retracted", s, "phone", 2, tenant=OTHER, event_id=ids[2]),
    ]
    publish(settings, y)
    pipe.caught_up()
    with pg(settings) as conn:
        assert facts(conn, TENANT, s) == {"email": "x@acme", "phone": "111", "name": "Xavier"}
        assert facts(conn, OTHER, s) == {"email": "y@globex", "city": "Rome"}
        assert count(conn, "events", TENANT, s) == 5 and count(conn, "events", OTHER, s) == 4
        per_tenant = dict(
            conn.execute(
                "SELECT tenant, count(*) FROM events WHERE event_id = ANY(%s) GROUP BY tenant", (ids,)
            ).fetchall()
        )
        assert per_tenant == {TENANT: 5, OTHER: 4}
        # a version's id is scoped by its tenant: the same event_id, two versions
        vids = conn.execute(
            "SELECT tenant, version_id FROM fact_versions WHERE event_id = %s ORDER BY tenant", (ids[0],)
        ).fetchall()
        assert vids == [(TENANT, version_id_for(TENANT, ids[0])), (OTHER, version_id_for(OTHER, ids[0]))]
        dead = conn.execute("SELECT count(*) FROM dead_letters WHERE code = 'event_id_conflict'").fetchone()[0]
    publish(settings, [erased(s, tenant=OTHER, event_id=ids[4])])
    pipe.caught_up()
    with pg(settings) as conn:
        assert facts(conn, OTHER, s) == {} and count(conn, "events", OTHER, s) == 1  # Y's erasure happened
        assert facts(conn, TENANT, s) == {"email": "x@acme", "phone": "111", "name": "Xavier"}  # X is untouched
        assert count(conn, "events", TENANT, s) == 5
        assert conn.execute("SELECT count(*) FROM dead_letters WHERE code = 'event_id_conflict'").fetchone()[0] == dead
    assert worker.alive()


def test_same_tenant_same_id_other_content_is_a_conflict_never_silently_dropped(pipe: Pipeline):
    settings, worker = pipe.settings, pipe.worker
    s = f"user:{uuid.uuid4().hex[:8]}"
    key = kafka_key(TENANT, s)
    first = [asserted(s, "email", "a@b.c", 0), asserted(s, "phone", "123", 0), asserted(s, "city", "Oslo", 0)]
    publish(settings, first)
    pipe.caught_up()
    clash = [
        asserted(s, "email", "evil@b.c", 0, event_id=first[0].event_id),  # another value
        marked("memory.retracted", s, "phone", 1, event_id=first[1].event_id),  # another type
        erased(s, event_id=first[2].event_id),  # an erasure
        asserted(s, "city", "Oslo", 0, event_id=first[2].event_id, tags=["x"]),  # one more tag
    ]
    placed = publish_raw(settings, [(key, encode(e)) for e in clash])
    pipe.caught_up()
    with pg(settings) as conn:
        dead = {po: d for po, d in dead_letters(conn, settings).items() if po in set(placed)}
        assert {po: (d[0], d[1]) for po, d in dead.items()} == dict.fromkeys(placed, ("event_id_conflict", "event_id"))
        assert all(
            first[0].event_id in d[2] or first[1].event_id in d[2] or first[2].event_id in d[2] for d in dead.values()
        )
        assert facts(conn, TENANT, s) == {"email": "a@b.c", "phone": "123", "city": "Oslo"}  # the originals stay
        assert count(conn, "events", TENANT, s) == 3 and count(conn, "fact_versions", TENANT, s) == 3
        stored = conn.execute(
            "SELECT fingerprint FROM events WHERE tenant = %s AND event_id = %s", (TENANT, first[0].event_id)
        ).fetchone()
        assert stored == (first[0].fingerprint,)
    bodies = dlq_envelopes(settings, want=placed)
    assert {bodies[po]["code"] for po in placed} == {"event_id_conflict"}
    assert {bodies[po]["field"] for po in placed} == {"event_id"}
    assert re.search(r" [1-9]\d* conflict,", worker.log())  # counted in the worker's batch line


def test_an_exact_redelivery_is_still_a_no_op(pipe: Pipeline):
    settings = pipe.settings
    s = f"user:{uuid.uuid4().hex[:8]}"
    key = kafka_key(TENANT, s)
    e = asserted(s, "drink", "tea", 0)
    retract = marked("memory.retracted", s, "drink", 3)
    no_time = {"event_id": uuid.uuid4().hex, "type": "memory.asserted", "tenant": TENANT, "subject": s, "key": "nick"}
    no_time |= {"content": "goes by bob", "value": "bob"}  # each delivery gets its own broker timestamp
    raws = [encode(e), encode(retract), orjson.dumps(no_time)]
    placed = publish_raw(settings, [(key, r) for r in raws * 3])
    # a publisher that stamps observed_at anew on each retry (valid_from defaulted): the same fingerprint
    stamped = [
        MemoryEvent(
            type="memory.asserted",
            tenant=TENANT,
            subject=s,
            key="lang",
            value="nl",
            content="speaks nl",
            event_id="lang-1",
            observed_at=at(day),
        )
        for day in (0, 0.5, 0.7)
    ]
    assert len({x.fingerprint for x in stamped}) == 1
    publish_raw(settings, [(key, encode(x)) for x in stamped])
    pipe.caught_up()
    with pg(settings) as conn:
        assert count(conn, "events", TENANT, s) == 4 and count(conn, "fact_versions", TENANT, s) == 3
        lang = conn.execute(
            "SELECT observed_at FROM fact_versions WHERE tenant = %s AND key = 'lang' AND subject = %s", (TENANT, s)
        ).fetchall()
        assert lang == [(at(0),)]
        status = conn.execute(
            "SELECT status, observed_at FROM fact_versions WHERE tenant = %s AND subject = %s AND key = 'drink'",
            (TENANT, s),
        ).fetchone()
        assert status == ("retracted", at(0))  # the first delivery is the one recorded
        assert not set(dead_letters(conn, settings)) & set(placed)


def test_recorder_counts_duplicates_conflicts_and_erased_replays(base_settings: Settings):
    """The same classes through the Recorder in one process (exact counts), on real PostgreSQL."""
    settings = base_settings.private(unique("idem"))
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    offset = 0

    def records(*events: MemoryEvent | bytes) -> list:
        nonlocal offset
        out = []
        for e in events:
            raw = e if isinstance(e, bytes) else encode(e)
            out.append(decode_record(settings.topic, 0, offset, raw, timestamp_ms=0))
            offset += 1
        return out

    s = "user:1"
    a, b = asserted(s, "a", 1), asserted(s, "b", 2)
    c = asserted(s, "c", 3)
    try:
        with connect(settings.pg_dsn, settings.pg_schema) as conn:
            rec = Recorder(conn, consumer="c", topic=settings.topic)
            r1 = rec.apply_batch(records(a, b))
            assert (r1.applied, r1.duplicates, r1.conflicts, r1.dead) == (2, 0, 0, 0)
            erase = erased(s)
            r2 = rec.apply_batch(
                records(
                    a,  # duplicate
                    asserted(s, "a", 99, event_id=a.event_id),  # conflict
                    asserted(s, "a", 1, tenant=OTHER, event_id=a.event_id),  # another tenant's: applied
                    c,
                    asserted(s, "c", 4, event_id=c.event_id),  # conflict with an event of the same batch
                    erase,
                )
            )
            assert (r2.applied, r2.duplicates, r2.conflicts, r2.dead, r2.erased_replays) == (3, 1, 2, 2, 0)
            new = asserted(s, "a", 5, 10)
            r3 = rec.apply_batch(records(a, b, c, asserted(s, "a", 77, event_id=a.event_id), erase, new))
            # a, b, c: erased ids re-sent, no effect; a's twin says something else under an erased id: a conflict;
            # the erasure again: a duplicate
            assert (r3.applied, r3.duplicates, r3.conflicts, r3.erased_replays) == (1, 1, 1, 3)
            other = pg(settings)
            assert facts(other, TENANT, s) == {"a": 5}
            assert facts(other, OTHER, s) == {"a": 1}
            assert other.execute("SELECT count(*) FROM erased_events").fetchone()[0] == 3  # a, b, c
            other.close()
    finally:
        cleanup(settings)


def test_erasure_survives_retries_and_a_rebuild_and_notifies_at_commit(pipe: Pipeline):
    settings, worker = pipe.settings, pipe.worker
    s = f"user:{uuid.uuid4().hex[:8]}"
    key = kafka_key(TENANT, s)
    before = [
        asserted(s, "email", "a@b.c", 0, entities=["ACME"], aliases=["al"]),
        asserted(s, "email", "new@b.c", 1),
        asserted(s, "pref.seat", "window", 0, kind="preference", valid_to=at(5)),
        marked("memory.confirmed", s, "email", 2),
        marked("memory.retracted", s, "pref.seat", 3),
        MemoryEvent(type="memory.asserted", tenant=TENANT, subject=s, kind="episodic", content="met at the cafe"),
    ]
    raws = [encode(e) for e in before]
    publish_raw(settings, [(key, r) for r in raws])
    pipe.caught_up()
    with pg(settings) as conn:
        ids = [e.event_id for e in before]
        assert asyncio.run(_claims(settings, TENANT, before)) == [
            Claim("applied", p, o)
            for p, o in conn.execute(
                'SELECT "partition", "offset" FROM events WHERE tenant = %s AND event_id = ANY(%s) ORDER BY "offset"',
                (TENANT, ids),
            ).fetchall()
        ]
    # nothing about another tenant's ids: the same ids are new there
    assert asyncio.run(_claims(settings, OTHER, before)) == [Claim("new")] * len(before)

    listener = psycopg.connect(settings.pg_dsn, autocommit=True)
    listener.execute(f"LISTEN {ERASURE_CHANNEL}")
    try:
        publish(settings, [erased(s, reason="GDPR")])
        heard: list[dict] = []

        def notified() -> bool:
            for n in listener.notifies(timeout=0.5, stop_after=1):
                body = orjson.loads(n.payload)
                if body["schema"] == settings.pg_schema:  # the channel is shared by every schema on the server
                    with pg(settings) as conn:  # delivered at commit: the purge is already visible
                        body["left"] = count(conn, "fact_versions", TENANT, s) + count(conn, "events", TENANT, s)
                    heard.append(body)
            return bool(heard)

        wait_for(notified, timeout=30, what="the erasure notification")
    finally:
        listener.close()
    assert heard == [{"schema": settings.pg_schema, "tenant": TENANT, "subject": s, "left": 1}]
    pipe.caught_up()

    # the README's retry advice, followed after the erasure: re-send everything, twice
    publish_raw(settings, [(key, r) for r in raws * 2])
    after = asserted(s, "email", "fresh@b.c", 9)  # a genuinely new event about the subject
    publish(settings, [after])
    pipe.caught_up()
    with pg(settings) as conn:
        assert facts(conn, TENANT, s) == {"email": "fresh@b.c"}
        assert count(conn, "fact_versions", TENANT, s) == 1
        types = [
            r[0]
            for r in conn.execute("SELECT type FROM events WHERE tenant = %s AND subject = %s ORDER BY 1", (TENANT, s))
        ]
        assert types == ["memory.asserted", "subject.erased"]
        ops = [
            r[0]
            for r in conn.execute(
                "SELECT op FROM search_outbox WHERE tenant = %s AND subject = %s ORDER BY id", (TENANT, s)
            )
        ]
        assert ops == ["delete_subject", "upsert"]
        assert conn.execute("SELECT count(*) FROM erased_events WHERE tenant = %s", (TENANT,)).fetchone()[0] >= len(ids)
        # no event id is kept in clear: erased_events has hashes only
        assert conn.execute("SELECT count(*) FROM events WHERE event_id = ANY(%s)", (ids,)).fetchone()[0] == 0
    known = asyncio.run(_claims(settings, TENANT, [*before, after]))
    assert [k.state for k in known] == ["erased"] * len(before) + ["applied"]
    assert re.search(r" [1-9]\d* erased replay,", worker.log()) and worker.alive()

    # a rebuild from offset 0 agrees, erased_events included (row for row: the salt is kept), and keeps the id a
    # door claimed for an event not applied yet
    in_flight = asserted(s, "email", "later@b.c", 10)
    assert asyncio.run(_claims(settings, TENANT, [in_flight])) == [Claim("new")]
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        live_erased = _erased_rows(admin, settings.pg_schema)
        report = rebuild(settings, keep_old=True)
        assert report.old_schema is not None
        assert report.live_checksum == report.rebuilt_checksum == projection_checksum(admin, settings.pg_schema)
        assert _erased_rows(admin, settings.pg_schema) == live_erased == _erased_rows(admin, report.old_schema)
    twin = asserted(s, "email", "other@b.c", 10, event_id=in_flight.event_id)
    assert asyncio.run(_claims(settings, TENANT, [twin])) == [Claim("conflict", holder="claimed")]
    assert asyncio.run(_claims(settings, TENANT, [in_flight])) == [Claim("claimed")]
    pipe.caught_up()
    publish_raw(settings, [(key, raws[0])])  # and the rebuilt projection still refuses the retry
    pipe.caught_up()
    with pg(settings) as conn:
        assert facts(conn, TENANT, s) == {"email": "fresh@b.c"} and count(conn, "fact_versions", TENANT, s) == 1


async def _claims(settings: Settings, tenant: str, events: list[MemoryEvent]) -> list[Claim]:
    """What a door's claim answers for these events published in `tenant` (claiming the unknown ones)."""
    conn = await connect_async(settings.pg_dsn, settings.pg_schema, autocommit=True)
    try:
        return await claim_events(conn, [(tenant, e.event_id, e.fingerprint) for e in events])
    finally:
        await conn.close()


def _erased_rows(conn: psycopg.Connection, schema: str) -> list[tuple]:
    return conn.execute(f'SELECT tenant, id_hash, fp_hash FROM "{schema}".erased_events ORDER BY 1, 2').fetchall()


def test_an_older_layout_is_refused_and_ledger_rebuild_migrates_it(base_settings: Settings):
    """A schema from before layout 2 is never half-used: the worker refuses it, `ledger rebuild` replays it."""
    settings = base_settings.private(unique("layout"))
    s = "user:old"
    events = [asserted(s, "a", 1), asserted(s, "a", 2, 1), asserted(s, "b", 3)]
    try:
        publish(settings, events)
        with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
            create_schema(admin, settings.pg_schema)
            with pg(settings) as conn:  # what a layout-1 schema looks like
                conn.execute("ALTER TABLE events DROP COLUMN fingerprint, DROP COLUMN target_version")
                conn.execute("ALTER TABLE fact_versions DROP COLUMN event_id")
                conn.execute("DROP TABLE erased_events, meta")
            with pytest.raises(SchemaOutdated, match="ledger rebuild"):
                create_schema(admin, settings.pg_schema)
            worker = Worker(settings).start()
            wait_for(lambda: not worker.alive(), timeout=60, what="the worker to refuse the old layout")
            assert worker.proc is not None and worker.proc.returncode != 0 and "ledger rebuild" in worker.log()
            report = rebuild(settings, keep_old=True)
            assert report.old_schema is not None and report.records == len(events)
            create_schema(admin, settings.pg_schema)  # the current layout now: accepted
        with pg(settings) as conn:
            assert facts(conn, TENANT, s) == {"a": 2, "b": 3}
            assert conn.execute("SELECT count(*) FROM events WHERE fingerprint IS NOT NULL").fetchone()[0] == 3
        with Worker(settings) as worker:
            wait_caught_up(settings, timeout=60, worker=worker)
    finally:
        cleanup(settings)

"""The PostgreSQL projection end to end: real Kafka, a real worker subprocess, real PostgreSQL.

One private topic/schema/group per module and one worker process shared by the tests (each test
uses its own subjects); the crash test kills and restarts it, the rebuild test switches schemas
under it.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime

import orjson
import psycopg
import pytest
from fastapi.testclient import TestClient
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from api.main import create_app
from producers.contract import MemoryEvent, encode, kafka_key, memory_id_for
from producers.sdk import LedgerProducer
from producers.settings import Settings
from projections.postgres.queries import projection_checksum
from projections.postgres.recorder import VERSION_COLUMNS, row_to_version
from projections.postgres.schema import create_schema, drop_schema
from projections.versions import chain_problems
from stream_processors.rebuild import rebuild, replay
from tests.conftest import unique
from tests.malformed import malformed_corpus
from tests.support import (
    TENANT,
    Pipeline,
    Worker,
    asserted,
    at,
    dlq_envelopes,
    end_offsets,
    erased,
    facts,
    marked,
    pg,
    pipeline,
    positions,
    publish,
    publish_raw,
    wait_for,
)
from tests.support.processes import frozen

HEADERS = {"X-API-Key": "dev-key"}
COLS = ", ".join(f'"{c}"' for c in VERSION_COLUMNS)  # every fact_versions column, in row_to_version's order


@pytest.fixture(scope="module")
def pipe(base_settings: Settings) -> Iterator[Pipeline]:
    """Private names + one running worker for the module (no indexer: PostgreSQL only)."""
    settings = base_settings.private(unique("pj"), processor_batch_size=200)
    with pipeline(settings, seed=[asserted("warmup", "k", 0, 0)], indexer=False, timeout=60) as p:
        yield p


def rows(conn: psycopg.Connection, subject: str, key: str | None = None):
    q = f"SELECT {COLS} FROM fact_versions "
    q += "WHERE tenant = %s AND subject = %s" + (" AND key = %s" if key else "") + " ORDER BY memory_id, version"
    return [row_to_version(r) for r in conn.execute(q, (TENANT, subject, key) if key else (TENANT, subject))]


def check_invariants(conn: psycopg.Connection) -> None:
    by_fact: dict[str, list] = {}
    for v in [row_to_version(r) for r in conn.execute(_ALL)]:
        by_fact.setdefault(v.memory_id, []).append(v)
    problems = {mid: chain_problems(vs) for mid, vs in by_fact.items() if chain_problems(vs)}
    assert problems == {}


_ALL = f"SELECT {COLS} FROM fact_versions"


def test_policies_supersede_override_episodic_retract_confirm(pipe: Pipeline):
    settings = pipe.settings
    s = f"user:{uuid.uuid4().hex[:8]}"
    publish(
        settings,
        [
            asserted(s, "project.port", 8080, 0),
            asserted(s, "project.port", 9090, 2),
            asserted(s, "pref.style", "concise", 0, kind="preference"),
            asserted(s, "pref.style", "detailed", 5, kind="preference", valid_to=at(6)),
            MemoryEvent(type="memory.asserted", tenant=TENANT, subject=s, kind="episodic", content="met at cafe"),
            MemoryEvent(type="memory.asserted", tenant=TENANT, subject=s, kind="episodic", content="met again"),
            asserted(s, "order.status", "paid", 1, kind="event"),
            asserted(s, "order.status", "refunded", 3, kind="event"),
            asserted(s, "city", "Paris", 0),
            marked("memory.retracted", s, "city", 4, reason="moved away"),
            marked("memory.confirmed", s, "project.port", 3),
            marked("memory.confirmed", s, "project.port", 4),
        ],
    )
    pipe.caught_up()
    with pg(settings) as conn:
        port = rows(conn, s, "project.port")
        assert [(v.value, v.status, v.version) for v in port] == [(8080, "superseded", 1), (9090, "active", 2)]
        assert (port[0].superseded_by, port[0].superseded_at) == (port[1].version_id, at(2))
        assert (port[1].confirmed_count, port[1].last_confirmed_at) == (2, at(4))
        style = rows(conn, s, "pref.style")
        assert [(v.value, v.status, v.superseded_by) for v in style] == [
            ("concise", "active", None),
            ("detailed", "active", None),
        ]
        order = rows(conn, s, "order.status")
        assert [(v.value, v.status) for v in order] == [("paid", "superseded"), ("refunded", "active")]
        city = rows(conn, s, "city")
        assert [(v.value, v.status, v.valid_to) for v in city] == [("Paris", "retracted", at(4))]
        episodes = [v for v in rows(conn, s) if v.kind == "episodic"]
        assert len(episodes) == 2 and len({v.memory_id for v in episodes}) == 2
        assert all((v.status, v.version) == ("active", 1) for v in episodes)
        outbox = conn.execute("SELECT count(*) FROM search_outbox WHERE subject = %s", (s,)).fetchone()[0]
        assert outbox >= 9  # every inserted/updated version was queued for search
        check_invariants(conn)

    with TestClient(create_app(settings)) as client:

        def facts(**params):
            r = client.get(f"/v1/subjects/{s}/facts", params={"tenant": TENANT, **params}, headers=HEADERS)
            assert r.status_code == 200, r.text
            return {(f["key"] or f["kind"]): f["value"] for f in r.json()["facts"]}

        now = facts()
        assert now["project.port"] == 9090 and now["pref.style"] == "concise" and "city" not in now
        assert facts(as_of=at(1).isoformat()) == {
            "project.port": 8080,
            "pref.style": "concise",
            "city": "Paris",
            "order.status": "paid",
        }
        assert facts(as_of=at(5.5).isoformat())["pref.style"] == "detailed"  # the override wins in its window
        assert facts(as_of=at(6.5).isoformat())["pref.style"] == "concise"
        # as known at day 1: the day-2 port and the day-4 retraction were not observed yet
        known = facts(as_of=at(30).isoformat(), known_at=at(1).isoformat())
        assert known["project.port"] == 8080 and known["city"] == "Paris"
        # the known_at path (Python fold) agrees with the SQL path when everything is known
        assert facts(as_of=at(30).isoformat(), known_at=at(3650).isoformat()) == facts(as_of=at(30).isoformat())

        mid = memory_id_for(TENANT, s, "project.port")
        r = client.get(f"/v1/facts/{mid}/history", params={"tenant": TENANT}, headers=HEADERS)
        assert r.status_code == 200
        versions = r.json()["versions"]
        assert [v["version"] for v in versions] == [1, 2]
        assert versions[0]["superseded_by"] == versions[1]["version_id"] and versions[0]["superseded_at"]
        assert {"source", "event_id", "partition", "offset", "status"} <= set(versions[0])
        assert client.get(f"/v1/facts/{mid}/history", params={"tenant": "globex"}, headers=HEADERS).status_code == 404
        assert client.get("/v1/facts/nope/history", params={"tenant": TENANT}, headers=HEADERS).status_code == 404

        r = client.get(f"/v1/subjects/{s}/events", params={"tenant": TENANT}, headers=HEADERS)
        evs = r.json()["events"]
        assert len(evs) == 12
        assert [(e["partition"], e["offset"]) for e in evs] == sorted((e["partition"], e["offset"]) for e in evs)
        r = client.get(
            f"/v1/subjects/{s}/events",
            params={"tenant": TENANT, "from": at(1).isoformat(), "to": at(3).isoformat()},
            headers=HEADERS,
        )
        assert {e["observed_at"][:10] for e in r.json()["events"]} == {"2026-03-02", "2026-03-03"}

        # tenancy and bad input
        r = client.get(f"/v1/subjects/{s}/facts", params={"tenant": "initech"}, headers=HEADERS)
        assert r.status_code == 403 and r.json()["detail"][0]["field"] == "tenant"
        r = client.get(f"/v1/subjects/{s}/facts", params={"tenant": TENANT, "as_of": "yesterday"}, headers=HEADERS)
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "as_of"
        r = client.get(
            f"/v1/subjects/{s}/facts", params={"tenant": TENANT, "known_at": "2026-01-01T00:00:00"}, headers=HEADERS
        )
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "known_at"
        assert client.get(f"/v1/subjects/{s}/facts", headers=HEADERS).status_code == 422
        assert client.get(f"/v1/subjects/{s}/facts", params={"tenant": TENANT}).status_code == 401


def test_late_event_is_inserted_as_history(pipe: Pipeline):
    settings = pipe.settings
    s = f"repo:org/{uuid.uuid4().hex[:8]}"  # a subject with a slash still has its own URL
    publish(settings, [asserted(s, "port", 1, 0), asserted(s, "port", 3, 10)])
    publish(settings, [asserted(s, "port", 2, 5, observed_at=at(20))])  # arrives last, older valid_from
    pipe.caught_up()
    with pg(settings) as conn:
        chain = rows(conn, s, "port")
    assert [(v.value, v.version, v.status) for v in chain] == [
        (1, 1, "superseded"),
        (2, 2, "superseded"),
        (3, 3, "active"),
    ]
    assert chain[0].superseded_by == chain[1].version_id and chain[1].superseded_by == chain[2].version_id
    assert chain[1].superseded_at == at(10)
    with TestClient(create_app(settings)) as client:
        r = client.get(f"/v1/subjects/{s}/facts", params={"tenant": TENANT}, headers=HEADERS)
        assert r.status_code == 200 and [f["value"] for f in r.json()["facts"]] == [3]
        r = client.get(f"/v1/subjects/{s}/events", params={"tenant": TENANT}, headers=HEADERS)
        assert [e["event"]["value"] for e in r.json()["events"]] == [1, 3, 2]  # ledger order, not valid time


def test_duplicate_delivery_is_one_version(pipe: Pipeline):
    settings = pipe.settings
    s = f"user:{uuid.uuid4().hex[:8]}"
    e = asserted(s, "drink", "tea", 0)
    e2 = asserted(s, "drink", "coffee", 1)
    raw = encode(e)
    key = kafka_key(TENANT, s)
    no_time = {"event_id": uuid.uuid4().hex, "type": "memory.asserted", "tenant": TENANT, "subject": s, "key": "nick"}
    no_time |= {"content": "goes by bob", "value": "bob"}  # observed_at comes from the record's timestamp
    sent_at = datetime.now(UTC)
    published = publish_raw(
        settings, [(key, raw), (key, encode(e2)), (key, raw), (key, raw), (key, orjson.dumps(no_time))]
    )
    pipe.caught_up()
    with pg(settings) as conn:
        (nick,) = rows(conn, s, "nick")
    assert abs((nick.observed_at - sent_at).total_seconds()) < 30 and nick.valid_from == nick.observed_at
    with pg(settings) as conn:
        chain = rows(conn, s, "drink")
        assert [(v.value, v.status) for v in chain] == [("tea", "superseded"), ("coffee", "active")]
        logged = conn.execute('SELECT event_id, "offset" FROM events WHERE subject = %s ORDER BY "offset"', (s,))
        assert [r[0] for r in logged] == [e.event_id, e2.event_id, no_time["event_id"]]
    assert chain[0].offset == published[0][1]  # the first delivery is the one recorded


def _tenant_named(raw: bytes | None) -> str | None:
    """The tenant a record's JSON names at its top level, as Python's parser reads it (None: it names none)."""
    try:
        doc = json.loads(raw) if raw else None
    except RecursionError:  # the corpus's record nested past the parser names its tenant before the nesting
        assert raw is not None and raw.startswith(b"{") and b'"tenant":"' + TENANT.encode() + b'"' in raw[:300]
        return TENANT
    except ValueError:
        return None
    tenant = doc.get("tenant") if isinstance(doc, dict) else None
    return tenant if isinstance(tenant, str) else None


def test_invalid_records_go_to_dlq_and_valid_ones_around_them_apply(pipe: Pipeline):
    settings = pipe.settings
    s = f"user:{uuid.uuid4().hex[:8]}"
    key = kafka_key(TENANT, s)
    corpus = malformed_corpus(TENANT, s)
    records: list[tuple[bytes, bytes | None]] = []
    valid = []
    for i, (raw, _code) in enumerate(corpus):
        ev = asserted(s, f"k{i}", i, 0)
        valid.append(ev)
        records += [(key, encode(ev)), (key, raw)]
    placed = publish_raw(settings, records)
    bad_at = {placed[2 * i + 1]: code for i, (_raw, code) in enumerate(corpus)}
    pipe.caught_up(60)
    with pg(settings) as conn:
        dead = {
            (p, o): (code, field, message, bytes(raw) if raw is not None else None, tenant)
            for p, o, code, field, message, raw, tenant in conn.execute(
                'SELECT "partition", "offset", code, field, message, raw, tenant FROM dead_letters WHERE topic = %s',
                (settings.topic,),
            )
        }
        applied = conn.execute("SELECT count(*) FROM fact_versions WHERE subject = %s", (s,)).fetchone()[0]
    mine = {po: d for po, d in dead.items() if po in bad_at}
    assert {po: d[0] for po, d in mine.items()} == bad_at  # each with its reason code
    assert all(d[2] for d in mine.values())  # and a message
    # each under the tenant its JSON names, whatever refused it (its tenant's operator sees it, its status says so);
    # no tenant's only where none can be read
    raw_at = {placed[2 * i + 1]: raw for i, (raw, _code) in enumerate(corpus)}
    assert {po: d[4] for po, d in mine.items()} == {po: _tenant_named(raw_at[po]) for po in mine}

    assert applied == len(valid)
    # the DLQ topic has each of them with the reason and the original bytes
    got = dlq_envelopes(settings, want=bad_at, timeout=30)
    raw_by_place = {placed[2 * i + 1]: raw for i, (raw, _c) in enumerate(corpus)}
    for po, code in bad_at.items():
        body = got[po]
        assert body["code"] == code and body["topic"] == settings.topic and body["message"]
        if not body["raw_truncated"]:
            assert base64.b64decode(body["raw_b64"]) == raw_by_place[po]


def _many(n_subjects: int, versions_per_fact: int, tag: str) -> list[MemoryEvent]:
    out = []
    for v in range(versions_per_fact):
        for i in range(n_subjects):
            day = v if (i + v) % 7 else versions_per_fact + 1 - v  # some late, out-of-order history
            out.append(asserted(f"{tag}:{i}", "port", v, day))
            if v == 1 and i % 5 == 0:
                out.append(marked("memory.retracted", f"{tag}:{i}", "port", day + 0.5))
            if v == 2 and i % 3 == 0:
                out.append(marked("memory.confirmed", f"{tag}:{i}", "port", day + 0.2))
    return out


def _expect_consistent(settings: Settings, events: list[MemoryEvent], tag: str) -> None:
    """Nothing lost, nothing doubled, invariants hold, and the state equals a fresh replay from offset 0."""
    with pg(settings) as conn:
        logged = conn.execute("SELECT count(*) FROM events WHERE subject LIKE %s", (f"{tag}:%",)).fetchone()[0]
        versions = conn.execute("SELECT count(*) FROM fact_versions WHERE subject LIKE %s", (f"{tag}:%",)).fetchone()[0]
        check_invariants(conn)
        double = conn.execute(
            "SELECT count(*) FROM (SELECT memory_id FROM fact_versions WHERE status = 'active' AND valid_to IS NULL "
            "AND superseded_by IS NULL GROUP BY memory_id HAVING count(*) > 1) d"
        ).fetchone()[0]
    assert logged == len(events)
    assert versions == sum(1 for e in events if e.type.value == "memory.asserted")
    assert double == 0
    fresh = settings.model_copy(update={"pg_schema": settings.pg_schema + "_replay_" + uuid.uuid4().hex[:6]})
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, fresh.pg_schema)
        try:
            replay(fresh, fresh.pg_schema, dict(positions(settings)))
            assert projection_checksum(admin, settings.pg_schema) == projection_checksum(admin, fresh.pg_schema)
        finally:
            drop_schema(admin, fresh.pg_schema)


def test_kill9_in_the_middle_then_restart_loses_and_doubles_nothing(pipe: Pipeline):
    settings = pipe.settings
    pipe.caught_up()
    pipe.worker.stop()
    tag = f"crash{uuid.uuid4().hex[:6]}"
    events = _many(300, 6, tag)
    publish(settings, events)
    ends = end_offsets(settings)
    before = positions(settings)
    worker = pipe.worker = Worker(settings).start()

    def partway():
        now = positions(settings)
        return sum(now.values()) > sum(before.values()) and now != {p: o for p, o in ends.items()}

    wait_for(partway, timeout=60, interval=0.02, what="the worker to be part-way")
    worker.kill()
    stored = positions(settings)
    assert sum(stored.values()) < sum(ends.values()), "the worker finished before it could be killed"
    worker = pipe.worker = Worker(settings).start()
    pipe.caught_up(120)
    assert "seeked to PostgreSQL positions" in worker.log()
    _expect_consistent(settings, events, tag)


def test_kafka_commits_ahead_of_postgres_do_not_skip_events(pipe: Pipeline):
    """faust may commit offsets to Kafka before the batch's PostgreSQL commit: the PG positions still win."""
    settings = pipe.settings
    pipe.caught_up()
    pipe.worker.stop()
    tag = f"ahead{uuid.uuid4().hex[:6]}"
    events = _many(50, 2, tag)
    publish(settings, events)
    ends = end_offsets(settings)
    assert any(positions(settings).get(p, 0) < o for p, o in ends.items())
    # the group's Kafka commit claims everything was consumed (as a crash after faust's commit would leave it)
    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, group_id=settings.processor_group, enable_auto_commit=False
    )
    try:
        consumer.commit({TopicPartition(settings.topic, p): OffsetAndMetadata(o, "", -1) for p, o in ends.items()})
    finally:
        consumer.close()
    pipe.worker = Worker(settings).start()
    pipe.caught_up(60)
    _expect_consistent(settings, events, tag)


def _batch_sizes(log: str) -> list[int]:
    """The records of each ledger batch a worker's log reports, in order."""
    return [int(n) for n in re.findall(r"\] stream_processors\.agents: batch: (\d+) records", log)]


def test_a_backlog_is_applied_in_full_batches(pipe: Pipeline):
    """A batch is what arrived while the one before it was applied: records waiting behind a stopped worker fill
    batches to the batch size (200 here), they are not cut into a batch per fetch or per record."""
    pipe.caught_up()
    tag = f"backlog{uuid.uuid4().hex[:6]}"
    events = [asserted(f"{tag}:{i}", "port", i, 0) for i in range(1000)]
    seen = len(pipe.worker.log())
    with frozen(pipe.worker):
        publish(pipe.settings, events)
    pipe.caught_up(120)
    logged = lambda: _batch_sizes(pipe.worker.log()[seen:])  # noqa: E731 - a batch's line follows its commit
    wait_for(lambda: sum(logged()) >= len(events), timeout=30, what="the batches' log lines")
    sizes = logged()
    assert sum(sizes) == len(events), sizes
    assert len(sizes) <= 8 and max(sizes) == 200, sizes  # 5 full batches; a few more where a fetch ended


def test_a_record_is_not_held_back_for_the_next_one(pipe: Pipeline):
    """A lone record is applied in a batch of its own, not held until another arrives or a batch fills: two
    records published seconds apart to an idle worker are two batches, the first applied before the second exists."""
    pipe.caught_up()
    tag = f"lone{uuid.uuid4().hex[:6]}"
    seen = len(pipe.worker.log())
    logged = lambda: _batch_sizes(pipe.worker.log()[seen:])  # noqa: E731 - a batch's line follows its commit
    publish(pipe.settings, [asserted(f"{tag}:a", "port", 1, 0)])
    pipe.caught_up(60)
    wait_for(lambda: logged(), timeout=30, what="the first batch's log line")
    first = logged()
    publish(pipe.settings, [asserted(f"{tag}:b", "port", 2, 0)])
    pipe.caught_up(60)
    wait_for(lambda: len(logged()) > 1, timeout=30, what="the second batch's log line")
    assert first == [1] and logged() == [1, 1]


def test_two_workers_share_the_partitions(pipe: Pipeline):
    settings = pipe.settings
    tag = f"pair{uuid.uuid4().hex[:6]}"
    events = _many(200, 4, tag)
    second = Worker(settings).start()
    try:
        publish(settings, events[: len(events) // 2])
        wait_for(lambda: "seeked to PostgreSQL positions" in second.log(), timeout=60, what="the second worker to join")
        publish(settings, events[len(events) // 2 :])
        pipe.caught_up(120)
        assert second.alive(), second.log()[-3000:]
        assert "applied" in second.log()  # it did take a share of the partitions
    finally:
        second.stop()
    _expect_consistent(settings, events, tag)


def test_kill9_of_one_of_two_workers_mid_stream(pipe: Pipeline):
    """The survivor takes the dead worker's partitions over from the PostgreSQL positions."""
    settings = pipe.settings
    tag = f"half{uuid.uuid4().hex[:6]}"
    events = _many(250, 4, tag)
    victim = Worker(settings).start()
    try:
        wait_for(lambda: "seeked to PostgreSQL positions" in victim.log(), timeout=60, what="the second worker to join")
        before = sum(positions(settings).values())
        publish(settings, events)
        wait_for(lambda: "applied" in victim.log() and sum(positions(settings).values()) > before, timeout=60)
        victim.kill()
        pipe.caught_up(120)
    finally:
        victim.kill()
    _expect_consistent(settings, events, tag)


def test_stats_report_healthy_invariants_and_lag(pipe: Pipeline):
    settings = pipe.settings
    pipe.caught_up()
    with TestClient(create_app(settings)) as client:
        r = client.get("/v1/stats", params={"tenant": TENANT}, headers=HEADERS)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["double_active"] == 0
        assert body["chain_integrity_violations"] == 0
        assert body["explicit_confidence_violations"] == 0
        assert body["events_applied"] > 0 and body["search_pending"] > 0
        assert body["total_lag"] == 0 and set(body["lag"]) == {str(p) for p in end_offsets(settings)}
        assert body["dlq_count"] >= 0
        assert client.get("/v1/stats", params={"tenant": "initech"}, headers=HEADERS).status_code == 403


def test_erasure_purges_the_subject_but_keeps_a_tombstone(pipe: Pipeline):
    settings = pipe.settings
    s = f"user:{uuid.uuid4().hex[:8]}"
    publish(settings, facts(s, {"email": "a@b.c", "phone": "123"}))
    publish(settings, [erased(s, reason="GDPR")])
    publish(settings, [asserted(s, "phone", "456", 9)])  # after the erasure: a new life
    pipe.caught_up()
    with pg(settings) as conn:
        left = [(v.key, v.value) for v in rows(conn, s)]
        types = Counter(r[0] for r in conn.execute("SELECT type FROM events WHERE subject = %s", (s,)))
        ops = [r[0] for r in conn.execute("SELECT op FROM search_outbox WHERE subject = %s ORDER BY id", (s,))]
    assert left == [("phone", "456")]
    assert types == {"subject.erased": 1, "memory.asserted": 1}
    assert ops == ["delete_subject", "upsert"]


def test_rebuild_switches_to_an_equal_projection_under_a_busy_worker(pipe: Pipeline):
    settings = pipe.settings
    pipe.caught_up()
    tag = f"reb{uuid.uuid4().hex[:6]}"
    sent: list[MemoryEvent] = []
    stop = threading.Event()

    def feed() -> None:  # the worker keeps writing while the rebuild replays and switches
        with LedgerProducer(settings) as producer:
            i = 0
            while not stop.is_set() and len(sent) < 2000:  # paced and bounded: keep the test small
                batch = [asserted(f"{tag}:{(i + j) % 20}", "n", i + j, (i + j) % 13) for j in range(20)]
                producer.publish_many(batch)
                sent.extend(batch)
                i += 20
                stop.wait(0.05)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        wait_for(lambda: len(sent) >= 200, timeout=30, what="the feeder to start")
        report = rebuild(settings, keep_old=False)
    finally:
        stop.set()
        feeder.join(30)
    assert report.live_checksum == report.rebuilt_checksum
    pipe.caught_up(60)
    assert pipe.worker.alive()
    # the worker went on in the new schema: nothing lost or doubled across the switch
    _expect_consistent(settings, sent, tag)

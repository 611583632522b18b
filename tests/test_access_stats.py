"""`/v1/stats` `access` from counters: exact through supersession, retraction, re-assertion, erasure,
redelivered access records and a rebuild, on the real pipeline.

The counters (projections.postgres.counts `facts_active`, `facts_active_served`, `accesses_active`) are kept by the
recorder and the access projector (projections.postgres.accesses). After each step the test recounts them itself
from the rows in one snapshot, checks /v1/stats reports them and /v1/stats/consistency finds no drift, and checks
the numbers this timeline must give, worked out by hand. The pure part (which facts a batch makes active or
inactive) has a unit test on chains folded by the pure core; a schema whose counters predate these gets them
once on its next start (schema.sql, `meta` row `counts_access`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from kafka import KafkaProducer

from api.access import caller_id
from producers.contract import AccessEvent, EventType, MemoryEvent, access_id_for, access_key, encode_access
from producers.settings import Settings
from projections.postgres.access_projector import AccessProjector, decode_access_record
from projections.postgres.accesses import active_transitions
from projections.postgres.positions import read_positions
from projections.postgres.queries import _ACCESS_COUNTERS, _MOST_SERVED
from projections.postgres.schema import create_schema
from projections.versions import apply
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.support import (
    Pipeline,
    RecorderWriter,
    Worker,
    asserted,
    end_offsets,
    erased,
    marked,
    pg,
    pipeline,
    private_store,
)

KEY = "stats-key"
H = {"X-API-Key": KEY}
TENANTS = ("acme", "globex")


# --- pure: which facts a batch makes active or inactive ------------------------------------------------------------


@pytest.mark.unit
def test_a_fact_is_active_while_a_version_is_neither_superseded_nor_retracted():
    first = asserted("user:1", "a", 1, 0)
    new = apply(first, [], [], partition=0, offset=0)
    assert active_transitions({}, new.inserts, new.updates) == {("acme", first.memory_id): 1}
    stored = {first.memory_id: new.inserts}

    second = asserted("user:1", "a", 2, 1)  # a supersession: still active
    sup = apply(second, stored[first.memory_id], [], partition=0, offset=1)
    assert sup.inserts and sup.updates and active_transitions(stored, sup.inserts, sup.updates) == {}
    chain = [*sup.updates, *sup.inserts]

    retraction = marked(EventType.RETRACTED, "user:1", "a", 2)  # ends the current version: no active one left
    ret = apply(retraction, chain, [], partition=0, offset=2)
    assert active_transitions({first.memory_id: chain}, ret.inserts, ret.updates) == {("acme", first.memory_id): -1}

    bounded = asserted("user:2", "a", 1, 0, valid_to=datetime(2026, 3, 2, tzinfo=UTC))  # ended in valid time: active
    old = apply(bounded, [], [], partition=0, offset=3)
    assert active_transitions({}, old.inserts, old.updates) == {("acme", bounded.memory_id): 1}
    assert active_transitions({}, [], []) == {}


# --- the pipeline ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipe(base_settings: Settings) -> Iterator[Pipeline]:
    settings = base_settings.private(unique("as"), api_keys={KEY: list(TENANTS)})
    with pipeline(settings, seed=[asserted("warmup", "k", 0, 0, tenant="globex")], app=True, timeout=120) as p:
        yield p


class Served:
    """Access records sent to the private access topic as the API's AccessRecorder sends them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sent: list[tuple[bytes, bytes]] = []
        self.n = 0

    def send(self, records: list[tuple[bytes, bytes]]) -> None:
        producer = KafkaProducer(bootstrap_servers=self.settings.kafka_bootstrap, acks="all")
        try:
            for key, value in records:
                producer.send(self.settings.access_topic, key=key, value=value)
            producer.flush(30)
        finally:
            producer.close(5)

    def serve(self, event: MemoryEvent, times: int) -> None:
        """`times` accesses (each its own serving) of the event's version."""
        records = []
        for _ in range(times):
            self.n += 1
            records.append((access_key(event.tenant, event.memory_id), served_record(event, f"serving-{self.n}")))
        self.send(records)
        self.sent += records


def served_record(event: MemoryEvent, serving: str) -> bytes:
    """The access record of one serving of the event's version, as the API's AccessRecorder encodes it."""
    caller = caller_id(KEY)
    a = AccessEvent(
        access_id=access_id_for(event.tenant, caller, serving, event.memory_id, event.version_id),
        tenant=event.tenant,
        memory_id=event.memory_id,
        version_id=event.version_id,
        stage="keyword",
        caller=caller,
        accessed_at=datetime.now(UTC),
    )
    return encode_access(a)


def access_caught_up(pipe: Pipeline, timeout: float = 60.0) -> None:
    s = pipe.settings
    ends = {p: o for p, o in end_offsets(s, s.access_topic).items() if o > 0}
    deadline = time.monotonic() + timeout
    while not all(read_positions(s, topic=s.access_topic).get(p, 0) >= o for p, o in ends.items()):
        if pipe.worker is not None:
            pipe.worker.check()
        assert time.monotonic() < deadline, f"access positions did not reach {ends}"
        time.sleep(0.2)


def recount(settings: Settings, tenant: str) -> tuple[dict[str, int], dict[str, int]]:
    """(the counters, the same numbers from the rows) for `tenant`, in one REPEATABLE READ snapshot, plain SQL."""
    with pg(settings) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        names = ["facts_active", "facts_active_served", "accesses_active"]
        counted = dict(conn.execute(_ACCESS_COUNTERS, {"tenant": tenant, "names": names}).fetchall())
        active, served, accesses = conn.execute(
            "SELECT count(*), count(a.memory_id), coalesce(sum(a.accesses), 0) FROM "
            "(SELECT DISTINCT memory_id FROM fact_versions WHERE tenant = %(t)s AND status = 'active') f "
            "LEFT JOIN access_counts a ON a.tenant = %(t)s AND a.memory_id = f.memory_id",
            {"t": tenant},
        ).fetchone()
    rows = {"facts_active": active, "facts_active_served": served, "accesses_active": accesses}
    return {k: int(counted.get(k, 0)) for k in rows}, {k: int(v) for k, v in rows.items()}


def check(pipe: Pipeline, step: str, expected: dict[str, tuple[int, int, int]]) -> dict[str, Any]:
    """Settled: per tenant the counters equal the rows and `expected` (active, served, accesses), /v1/stats says so
    and the consistency check finds no drift."""
    pipe.settle()
    access_caught_up(pipe)
    seen = {}
    for tenant in TENANTS:
        counted, rows = recount(pipe.settings, tenant)
        assert counted == rows, f"{step}, {tenant}: counters {counted} != rows {rows}"
        assert tuple(rows.values()) == expected[tenant], f"{step}, {tenant}: {rows} != {expected[tenant]}"
        r = pipe.client.get("/v1/stats", params={"tenant": tenant}, headers=H)
        assert r.status_code == 200, r.text
        access = r.json()["access"]
        active, served, accesses = expected[tenant]
        assert (access["active_facts"], access["served_facts"], access["accesses_of_active"]) == expected[tenant]
        assert access["never_retrieved_ratio"] == round((active - served) / active, 6)
        full = pipe.client.get("/v1/stats/consistency", params={"tenant": tenant}, headers=H).json()
        assert full["counter_drift"] == {} and full["consistent"] is True, f"{step}, {tenant}: {full}"
        assert full["counters"]["facts_active_served"] == {"counted": served, "recounted": served}
        seen[tenant] = access
    return seen


def test_the_access_counters_stay_exact_through_the_chain_redelivery_erasure_and_a_rebuild(pipe: Pipeline):
    s, run = pipe.settings, uuid.uuid4().hex[:6]
    sub = {n: f"user:{run}-{n}" for n in ("one", "two", "gone", "late")}
    served = Served(s)
    f1, f2 = asserted(sub["one"], "a", 1, 0), asserted(sub["one"], "b", 1, 0)
    f3, f4 = asserted(sub["two"], "a", 1, 0), asserted(sub["two"], "b", 1, 0)
    f5, f6 = asserted(sub["gone"], "a", 1, 0), asserted(sub["gone"], "b", 1, 0)
    # ended in valid time long ago (holds now: no), but neither superseded nor retracted: active
    f7 = asserted(sub["two"], "c", 1, 0, valid_to=datetime(2026, 3, 2, tzinfo=UTC))
    g1 = asserted(sub["one"], "a", 1, 0, tenant="globex")
    late = asserted(sub["late"], "a", 1, 4)  # served before the ledger has it
    pipe.publish([f1, f2, f3, f4, f5, f6, f7, g1])
    pipe.settle()
    served.serve(f1, 3)
    served.serve(f2, 1)
    served.serve(f5, 2)
    served.serve(f7, 1)
    served.serve(g1, 1)
    served.serve(late, 2)  # no version of it yet: its accesses are kept, not counted
    check(pipe, "ingest", {"acme": (7, 4, 7), "globex": (2, 1, 1)})  # globex: the warm-up fact and g1

    # a supersession keeps the fact active; an access of the new version counts
    f1b = asserted(sub["one"], "a", 2, 1)
    pipe.publish([f1b])
    pipe.settle()
    served.serve(f1b, 1)
    check(pipe, "supersession", {"acme": (7, 4, 8), "globex": (2, 1, 1)})

    # a retraction ends f2's only version: inactive, its access no longer counts; a later access of it neither
    pipe.publish([marked(EventType.RETRACTED, sub["one"], "b", 2)])
    pipe.settle()
    served.serve(f2, 1)
    check(pipe, "retraction", {"acme": (6, 3, 7), "globex": (2, 1, 1)})

    # the fact served before it existed is asserted: active and served, with both accesses
    pipe.publish([late])
    check(pipe, "late fact", {"acme": (7, 4, 9), "globex": (2, 1, 1)})

    # f2 told again: active again, with the 2 accesses it had
    pipe.publish([asserted(sub["one"], "b", 2, 3)])
    after = check(pipe, "re-assertion", {"acme": (8, 5, 11), "globex": (2, 1, 1)})
    assert after["acme"]["most_served"][0]["memory_id"] == f1.memory_id  # 4 accesses
    assert after["acme"]["most_served"][0]["accesses"] == 4

    # every access record again, at new offsets (a producer retry): nothing changes
    served.send(served.sent)
    check(pipe, "redelivery", {"acme": (8, 5, 11), "globex": (2, 1, 1)})

    # erasure of a subject with a served fact (f5: 2 accesses) and an unserved one
    pipe.publish([erased(sub["gone"])])
    before_rebuild = check(pipe, "erasure", {"acme": (6, 4, 9), "globex": (2, 1, 1)})

    # a rebuild replays both topics into a fresh schema: the same counters
    assert pipe.worker is not None
    pipe.worker.stop()
    pipe.worker = None
    report = rebuild(s, keep_old=False)
    assert report.live_checksum == report.rebuilt_checksum
    for tenant in TENANTS:
        counted, rows = recount(s, tenant)
        assert counted == rows, (tenant, counted, rows)
    pipe.worker = Worker(s).start()
    assert check(pipe, "rebuild", {"acme": (6, 4, 9), "globex": (2, 1, 1)}) == before_rebuild


def test_the_access_summary_reads_counters_and_an_index(pipe: Pipeline):
    """No scan of fact_versions: the counters are primary-key lookups, most_served walks access_counts_most in order."""
    with pg(pipe.settings) as conn:
        # the tables are small here, where sorting 5 rows is cheapest: ask whether an index gives the order
        conn.execute("SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off")
        counters = "\n".join(
            r[0] for r in conn.execute("EXPLAIN " + _ACCESS_COUNTERS, {"tenant": "acme", "names": ["facts_active"]})
        )
        most = "\n".join(r[0] for r in conn.execute("EXPLAIN " + _MOST_SERVED, {"tenant": "acme", "top": 10}))
    assert "Seq Scan" not in counters and "fact_versions" not in counters, counters
    assert "access_counts_most" in most and "Seq Scan" not in most and "Sort" not in most, most


def test_a_schema_that_predates_the_access_counters_gets_them_once(base_settings: Settings):
    settings = base_settings.private(unique("asb"))
    with private_store(settings) as (conn, _es):
        ledger = RecorderWriter(settings)
        try:
            kept, dropped = asserted("user:b", "a", 1, 0), asserted("user:b", "b", 1, 0)
            ledger.apply(kept, dropped, marked(EventType.RETRACTED, "user:b", "b", 1))
            projector = AccessProjector(ledger.conn, consumer="backfill-tests", topic=settings.access_topic)
            for i, e in enumerate((kept, kept, dropped)):  # 2 accesses of the active fact, 1 of the retracted one
                projector.apply_batch([decode_access_record(settings.access_topic, 0, i, served_record(e, f"b-{i}"))])
        finally:
            ledger.close()
        assert recount(settings, "acme") == ({"facts_active": 1, "facts_active_served": 1, "accesses_active": 2},) * 2
        # as a schema of the layout before them: no access counters, no meta row
        conn.execute("DELETE FROM counts WHERE name IN ('facts_active', 'facts_active_served', 'accesses_active')")
        conn.execute("DELETE FROM meta WHERE name = 'counts_access'")
        assert recount(settings, "acme")[0] == {"facts_active": 0, "facts_active_served": 0, "accesses_active": 0}
        with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
            create_schema(admin, settings.pg_schema)  # the next start
            create_schema(admin, settings.pg_schema)  # and the one after: counted once, not twice
        assert recount(settings, "acme") == ({"facts_active": 1, "facts_active_served": 1, "accesses_active": 2},) * 2

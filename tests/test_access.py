"""Access tracking: what recall serves becomes access events on their own topic, projected exactly once,
rebuildable, erased with the subject, read by the ranking prior and reported by /v1/stats.

Against the real servers: the flow test runs the whole pipeline (SDK -> Kafka -> worker -> PostgreSQL -> indexer
-> Elasticsearch -> the app, whose AccessRecorder sends to the private access topic, which the same worker
projects). The ranking and outage tests write facts through the recorder (tests.support.RecorderWriter) and
accesses through the access projector the worker runs, on a private schema and index.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from kafka import KafkaAdminClient, KafkaProducer
from prometheus_client import REGISTRY

from api.access import AccessRecorder, CallerTenants, caller_id, caller_of
from api.main import create_app
from producers.contract import (
    AccessEvent,
    EventType,
    InvalidEvent,
    MemoryEvent,
    Source,
    SourceType,
    access_id_for,
    access_key,
    decode,
    decode_access,
    encode_access,
)
from producers.settings import UnsafeSettings, check_names
from projections.embedding import load_embedder
from projections.postgres.access_projector import AccessProjector, decode_access_record
from projections.postgres.positions import read_positions
from projections.search.recall.access import order_ties, tied_memory_ids
from projections.search.recall.model import Candidate
from projections.search.recall.scoring import MAX_ACCESS_WEIGHT, access_signal, prior, score
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.support import (
    RecorderWriter,
    Worker,
    drain_all,
    end_offsets,
    pg,
    pipeline,
    private_store,
    read_topic,
    wait_for,
)

TENANT = "acme"
KEY = "access-key"
T0 = datetime(2026, 2, 2, 9, 0, tzinfo=UTC)


def _access(tenant: str, memory_id: str, version_id: str, serving: str, at: datetime, **over) -> AccessEvent:
    caller = over.pop("caller", caller_id(KEY))
    return AccessEvent(
        access_id=access_id_for(tenant, caller, serving, memory_id, version_id),
        tenant=tenant,
        memory_id=memory_id,
        version_id=version_id,
        stage=over.pop("stage", "keyword"),
        caller=caller,
        accessed_at=at,
        **over,
    )


# --- pure parts ----------------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_an_access_event_round_trips_and_its_id_names_the_serving():
    e = _access(TENANT, "m1", "v1", "req-1", T0, request_id="req-1")
    assert decode_access(encode_access(e)) == e
    assert e.access_id == access_id_for(TENANT, caller_id(KEY), "req-1", "m1", "v1")  # the same serving: same id
    assert e.access_id != access_id_for(TENANT, caller_id(KEY), "req-2", "m1", "v1")
    assert e.access_id != access_id_for("globex", caller_id(KEY), "req-1", "m1", "v1")
    assert access_key(TENANT, "m1") == b"acme|m1"
    for raw, code in ((b"[1]", "not_an_object"), (b"{", "bad_json"), (None, "empty"), (b'{"tenant": "x"}', None)):
        with pytest.raises(InvalidEvent) as err:
            decode_access(raw)
        assert code is None or err.value.code == code
    with pytest.raises(InvalidEvent) as err:  # the text rule of every event: nothing PostgreSQL cannot store
        decode_access(encode_access(e).replace(b'"stage":"keyword"', b'"stage":"key\\u0000word"'))
    assert err.value.code == "unstorable_text"


@pytest.mark.unit
def test_the_caller_is_a_stable_fingerprint_never_the_key():
    assert caller_id(KEY) == caller_id(KEY) and caller_id(KEY) != caller_id("other-key")
    assert KEY not in caller_id(KEY) and caller_id(KEY).startswith("key:")
    tenants = CallerTenants(["acme", "globex"], caller_id(KEY))
    assert tenants == frozenset({"acme", "globex"}) and "acme" in tenants and caller_of(tenants) == caller_id(KEY)
    assert caller_of(frozenset({"acme"})) == "unknown"


@pytest.mark.unit
def test_the_access_topic_is_never_the_ledger(base_settings):
    for topic in (base_settings.topic, base_settings.dlq_topic):
        with pytest.raises(ValueError, match="LEDGER_ACCESS_TOPIC"):  # UnsafeSettings, inside pydantic's error
            type(base_settings)(**{**base_settings.model_dump(), "access_topic": topic})
        with pytest.raises(UnsafeSettings):
            check_names(base_settings.model_copy(update={"access_topic": topic}))
    assert base_settings.private("t_x").access_topic == "t_x.access"


@pytest.mark.unit
def test_without_accesses_the_prior_is_what_it_was():
    row = {"valid_from": T0, "importance": 0.7, "confidence": 0.8, "memory_id": "m"}
    at = T0 + timedelta(days=3)
    before = 0.4 * 0.5 ** (3 / 30) + 0.3 * 0.7 + 0.3 * 0.8  # the prior before access tracking
    assert prior(row, at) == before
    for never in ({}, {"accesses": None, "last_accessed_at": None}, {"accesses": 0, "last_accessed_at": T0}):
        assert access_signal({**row, **never}, at) == 0.0
        assert prior({**row, **never}, at, access_signal({**row, **never}, at), MAX_ACCESS_WEIGHT) == before
    served = {**row, "accesses": 5, "last_accessed_at": at}
    assert prior(served, at, access_signal(served, at)) == before  # weight 0 (the default): only ties
    assert before < prior(served, at, access_signal(served, at), 0.05) < prior(served, at, 1.0, 0.5) == before + 0.1


@pytest.mark.unit
def test_the_access_signal_grows_with_frequency_and_recency_and_stays_small():
    at = T0 + timedelta(days=10)
    row = {"valid_from": T0, "importance": 0.5, "confidence": 1.0}

    def signal(n: int, days_ago: float) -> float:
        return access_signal({**row, "accesses": n, "last_accessed_at": at - timedelta(days=days_ago)}, at)

    assert 0 < signal(1, 30) < signal(10, 30) < signal(100, 30) == signal(10_000, 30) <= 1.0
    assert signal(5, 30) < signal(5, 7) < signal(5, 0)
    assert signal(5, 0) == signal(5, -1)  # an access "after" the recall's as_of counts as just now, never more
    assert signal(10**9, 0) == 1.0
    # the strongest fuzzy hit, served a billion times just now, stays below the weakest exact hit
    assert score(0.0, 1.0, 1.0 + MAX_ACCESS_WEIGHT * signal(10**9, 0)) < score(1.0, 0.0, 0.0)


@pytest.mark.unit
def test_ties_a_stage_cannot_break_go_by_access_then_by_version_id_never_the_index_order():
    stage = object()
    cands = [
        Candidate("va", "a", 3.0),
        Candidate("vd", "d", 2.0),  # the index's order of a tie is its storage's: not version order
        Candidate("vb", "b", 2.0),
        Candidate("vc", "c", 2.0),
        Candidate("ve", "e", 1.0),
        Candidate("vg", "g"),  # exact candidates have no score: never a tie, never moved
        Candidate("vf", "f"),
    ]
    found = [(stage, cands)]
    assert tied_memory_ids(found) == ["b", "c", "d"]
    assert tied_memory_ids([(stage, [cands[0], cands[1], cands[4], cands[5], cands[6]])]) == []

    def order(signals):
        return [c.memory_id for c in order_ties(found, signals)[0][1]]

    assert order({}) == ["a", "b", "c", "d", "e", "g", "f"]  # nothing served: version order, whatever the index's
    assert order({"a": 0.9, "e": 0.9}) == ["a", "b", "c", "d", "e", "g", "f"]  # no tie among them: no effect
    assert order({"d": 0.5, "c": 0.2}) == ["a", "d", "c", "b", "e", "g", "f"]
    assert order({"c": 0.2}) == ["a", "c", "b", "d", "e", "g", "f"]
    assert [c.memory_id for c in cands] == ["a", "d", "b", "c", "e", "g", "f"]  # the input is left as it was


@pytest.mark.unit
def test_served_never_blocks_and_a_full_queue_drops_and_counts(base_settings):
    settings = base_settings.private(unique("accq"), access_queue_size=3)
    recorder = AccessRecorder(settings, enabled=True)  # not started: nothing drains the queue
    hits = [{"memory_id": "m", "version_id": "v", "match": {"stage": "exact"}}] * 2
    before = REGISTRY.get_sample_value("ledger_access_dropped_total", {"reason": "queue_full"}) or 0.0
    started = time.perf_counter()
    for _ in range(1000):
        recorder.served(TENANT, "c", hits)
    per_call_us = (time.perf_counter() - started) / 1000 * 1e6
    assert recorder.pending == 3 and recorder.dropped == (1000 - 3) * 2
    assert REGISTRY.get_sample_value("ledger_access_dropped_total", {"reason": "queue_full"}) == before + 997 * 2
    # a few microseconds measured; the bound only catches a blocking call (a broker's connect is far slower), with
    # room for a pause of the whole process on a busy machine
    assert per_call_us < 1000, per_call_us
    recorder.served(TENANT, "c", [])  # nothing served: nothing recorded
    off = AccessRecorder(settings, enabled=False)
    off.served(TENANT, "c", hits)
    assert off.pending == 0 and off.dropped == 0


# --- the whole flow: recall -> access topic -> worker -> PostgreSQL; redelivery, restart, rebuild, erasure -----------


def _fact(subject: str, key: str, content: str, value: object, entity: str, hours: int = 0) -> MemoryEvent:
    return MemoryEvent(
        type=EventType.ASSERTED,
        tenant=TENANT,
        subject=subject,
        key=key,
        content=content,
        value=value,
        entities=[entity],
        source=Source(type=SourceType.EXPLICIT, service="tests"),
        valid_from=T0 + timedelta(hours=hours),
        observed_at=T0 + timedelta(hours=hours),
    )


SEED = [
    _fact("project:P7", "project.backend_port", "P7 backend port is 8080", 8080, "P7", 0),
    _fact("project:P7", "project.frontend_port", "P7 frontend port is 3000", 3000, "P7", 1),
    _fact("project:P7", "project.deploy_host", "P7 is deployed on host 10.0.0.7", "10.0.0.7", "P7", 2),
    _fact("project:P8", "project.backend_port", "P8 backend port is 7000", 7000, "P8", 3),
]


def _state(settings) -> tuple[list, list]:
    """access_counts and accesses, in key order (what a rebuild must reproduce)."""
    with pg(settings) as conn:
        counts = conn.execute(
            "SELECT tenant, memory_id, accesses, last_accessed_at FROM access_counts ORDER BY tenant, memory_id"
        ).fetchall()
        log = conn.execute(
            "SELECT tenant, access_id, memory_id, version_id, stage, via, caller, request_id, accessed_at, "
            '"partition", "offset" FROM accesses ORDER BY tenant, access_id'
        ).fetchall()
    return counts, log


def _counts(settings) -> dict[str, int]:
    return {m: n for _, m, n, _ in _state(settings)[0]}


def _access_caught_up(settings, worker: Worker | None, timeout: float = 60.0) -> None:
    ends = {p: o for p, o in end_offsets(settings, settings.access_topic).items() if o > 0}
    check = worker.check if worker is not None else None
    deadline = time.monotonic() + timeout
    while not all(read_positions(settings, topic=settings.access_topic).get(p, 0) >= o for p, o in ends.items()):
        if check is not None:
            check()
        assert time.monotonic() < deadline, f"access positions did not reach {ends}"
        time.sleep(0.2)


def test_recall_records_each_served_memory_once_on_the_access_topic_and_projects_it_exactly_once(base_settings):
    settings = base_settings.private(unique("acc"), api_keys={KEY: [TENANT]})
    with pipeline(settings, seed=SEED, app=True) as pipe:
        assert pipe.client is not None and pipe.worker is not None
        client, recorder = pipe.client, pipe.client.app.state.resources.access

        def recall(query: str, request_id: str, top_k: int = 10) -> list[dict]:
            r = client.post(
                "/v1/recall",
                json={"tenant": TENANT, "query": query, "top_k": top_k},
                headers={"X-API-Key": KEY, "X-Request-ID": request_id},
            )
            assert r.status_code == 200, r.text
            return r.json()["hits"]

        # the exact stage answers "P7" with everything about P7 once the vocabulary knows it
        def all_of_p7() -> list[dict]:
            hits = [h for h in recall("P7", "warm-up") if h["subject"] == "project:P7"]
            return hits if len(hits) == 3 else []

        wait_for(all_of_p7, 60, 0.5, "an exact answer with P7's three facts")
        recorder.flush()
        baseline = len(read_topic(settings, settings.access_topic))  # the warm-up's accesses

        hits = recall("P7", "flow-1")
        assert len(hits) == 3 and {h["match"]["stage"] for h in hits} == {"exact"}
        recorder.flush()
        records = wait_for(
            lambda: (r := read_topic(settings, settings.access_topic)) and len(r) >= baseline + 3 and r, 30, 0.2
        )
        mine = [(r, a) for r in records if (a := decode_access(r.value)).request_id == "flow-1"]
        assert len(records) == baseline + 3 and len(mine) == 3  # k hits -> k access events
        assert {(a.memory_id, a.version_id) for _, a in mine} == {(h["memory_id"], h["version_id"]) for h in hits}
        for r, a in mine:
            assert (a.tenant, a.stage, a.via, a.caller) == (TENANT, "exact", "recall", caller_id(KEY))
            assert r.key == access_key(TENANT, a.memory_id) and KEY.encode() not in r.value
        # never on the ledger: the ledger topic holds the seed's events and nothing else
        ledger = read_topic(settings)
        assert len(ledger) == len(SEED) and all(decode(r.value).type is EventType.ASSERTED for r in ledger)

        _access_caught_up(settings, pipe.worker)
        p7 = {h["memory_id"] for h in hits}
        counts = _counts(settings)
        assert {m: counts[m] for m in p7} == dict.fromkeys(p7, 2)  # the warm-up's and flow-1's
        assert recorder.recorded >= baseline + 3 and recorder.dropped == 0

        # redelivery: the same records again at new offsets, and the same request retried: no effect
        producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
        try:
            for r in records:
                producer.send(settings.access_topic, key=r.key, value=r.value)
            producer.flush(30)
        finally:
            producer.close(5)
        recall("P7", "flow-1")
        recorder.flush()
        _access_caught_up(settings, pipe.worker)
        assert _counts(settings) == counts and len(_state(settings)[1]) == 6  # warm-up's 3 and flow-1's 3

        # a worker killed and restarted resumes from the PostgreSQL positions: nothing counted twice
        pipe.worker.kill()
        pipe.worker = Worker(settings).start()
        recall("P7", "flow-2")  # one new serving of each P7 fact
        recall("P8 backend port", "flow-3", top_k=1)
        recorder.flush()
        _access_caught_up(settings, pipe.worker, timeout=90)
        after = _counts(settings)
        assert {m: after[m] for m in p7} == dict.fromkeys(p7, 3)
        p8 = [m for m in after if m not in p7]
        assert len(p8) == 1 and after[p8[0]] == 1

        # the never-retrieved ratio and the most-served facts
        stats = client.get("/v1/stats", params={"tenant": TENANT}, headers={"X-API-Key": KEY})
        assert stats.status_code == 200, stats.text
        access = stats.json()["access"]
        assert (access["active_facts"], access["served_facts"], access["never_retrieved_ratio"]) == (4, 4, 0.0)
        assert access["accesses_of_active"] == 10
        assert [m["memory_id"] for m in access["most_served"]][3] == p8[0]
        assert {m["memory_id"] for m in access["most_served"][:3]} == p7
        assert all(m["accesses"] == 3 and m["subject"] == "project:P7" for m in access["most_served"][:3])

        # a rebuild from offset 0 (ledger, then the access topic) gives the same access tables
        pipe.worker.stop()
        live = _state(settings)
        report = rebuild(settings, keep_old=False)
        assert report.live_checksum == report.rebuilt_checksum
        assert _state(settings) == live

        # erasure: the subject's accesses and aggregates go with it; another subject's stay
        pipe.worker = Worker(settings).start()
        r = client.delete("/v1/subjects/project:P7", params={"tenant": TENANT}, headers={"X-API-Key": KEY})
        assert r.status_code in (200, 202), r.text
        pipe.caught_up(90)
        assert _counts(settings) == {p8[0]: 1}
        with pg(settings) as conn:
            assert (
                conn.execute("SELECT count(*) FROM accesses WHERE memory_id = ANY(%s)", (list(p7),)).fetchone()[0] == 0
            )
            assert conn.execute("SELECT count(*) FROM erased_versions").fetchone()[0] == 3
        # and a rebuild from 0 replays the erased subject's accesses into nothing
        pipe.worker.stop()
        live = _state(settings)
        report = rebuild(settings, keep_old=False)
        assert report.live_checksum == report.rebuilt_checksum and _state(settings) == live
        assert _counts(settings) == {p8[0]: 1}
        pipe.worker = None


# --- ranking and outages: facts through the recorder, accesses through the access projector -------------------------


@pytest.fixture(scope="module")
def world(base_settings):
    name = unique("accw")
    # the access topic is never created here: the app's own recordings are dropped (that is tested too)
    settings = base_settings.private(name, api_keys={KEY: [TENANT]}, api_kafka_timeout_s=2.0)
    embedder = load_embedder(settings)
    with private_store(settings) as (conn, es):
        ledger = RecorderWriter(settings, conn)
        note = "the quarterly planning meeting moved to the blue room"
        port = "P9 backend port is 8080"
        old_port = "P9 backend port used to be 9090 before the migration"
        facts = {
            "exact": ledger.assert_fact(
                TENANT, "project:P9", "project.backend_port", port, 8080, aliases=["backend port"], entities=["P9"]
            ),
            "popular": ledger.assert_fact(TENANT, "project:P9", "project.notes", old_port, None, entities=["P9"]),
            "note_a": ledger.assert_fact(TENANT, "team:red", "note.meeting_a", note, "blue", valid_from=T0),
            "note_b": ledger.assert_fact(TENANT, "team:green", "note.meeting_b", note, "blue", valid_from=T0),
            "erased": ledger.assert_fact(TENANT, "user:erase-me", "pref.drink", "erase-me likes cocoa", "cocoa"),
        }
        drain_all(settings, conn, es, embedder)
        projector = AccessProjector(
            RecorderWriter(settings).conn, consumer="access-tests", topic=settings.access_topic
        )  # a transactional connection of its own
        weighted = settings.model_copy(update={"access_prior_weight": MAX_ACCESS_WEIGHT})
        with TestClient(create_app(settings)) as client, TestClient(create_app(weighted)) as weighted_client:
            yield {
                "settings": settings,
                "client": client,  # the default: the access signal only breaks ties
                "weighted": weighted_client,  # the access signal in the score with the largest weight allowed
                "ledger": ledger,
                "facts": facts,
                "projector": projector,
                "offset": [0],
            }
        projector.conn.close()
        ledger.close()


def _recall(world, query: str, mode: str = "auto", top_k: int = 5, client: str = "client") -> list[dict]:
    r = world[client].post(
        "/v1/recall", json={"tenant": TENANT, "query": query, "mode": mode, "top_k": top_k}, headers={"X-API-Key": KEY}
    )
    assert r.status_code == 200, r.text
    return r.json()["hits"]


def _serve(world, event: MemoryEvent, n: int, at: datetime) -> object:
    """`n` accesses of the event's version, through the access projector (the worker's code), one batch."""
    topic = world["settings"].access_topic
    records = []
    for i in range(n):
        a = _access(TENANT, event.memory_id, event.version_id, f"serving-{world['offset'][0]}-{i}", at)
        records.append(decode_access_record(topic, 0, world["offset"][0], encode_access(a)))
        world["offset"][0] += 1
    return world["projector"].apply_batch(records)


def test_of_two_otherwise_equal_fuzzy_memories_the_more_served_ranks_first(world):
    a, b = world["facts"]["note_a"], world["facts"]["note_b"]
    query = "quarterly planning meeting blue room"
    hits = _recall(world, query, mode="keyword")
    assert {h["memory_id"] for h in hits} == {a.memory_id, b.memory_id}
    assert hits[0]["match"]["scores"]["bm25"] == hits[1]["match"]["scores"]["bm25"]  # the stage cannot tell them apart
    assert _recall(world, query, mode="keyword") == hits  # unserved, they keep the index's order
    assert _recall(world, query, mode="keyword", client="weighted") == hits  # whatever the weight
    last = hits[1]["memory_id"]
    assert all("access" not in h["match"]["scores"] for h in hits)

    _serve(world, b if last == b.memory_id else a, 3, datetime.now(UTC))
    for client in ("client", "weighted"):
        again = _recall(world, query, mode="keyword", client=client)
        assert again[0]["memory_id"] == last and again[0]["score"] > again[1]["score"]
        assert again[0]["match"]["scores"]["access"] > 0 and "access" not in again[1]["match"]["scores"]
        assert _recall(world, query, mode="keyword", client=client) == again  # deterministic for the state
        for mode in ("hybrid", "auto"):  # fused with the semantic list too, the more-served one stays first
            assert _recall(world, query, mode=mode, client=client)[0]["memory_id"] == last


def test_an_exact_hit_stays_above_a_heavily_served_fuzzy_one(world):
    exact, popular = world["facts"]["exact"], world["facts"]["popular"]
    _serve(world, popular, 500, datetime.now(UTC))
    scores = {}
    for client in ("client", "weighted"):  # the largest weight the settings allow
        hits = _recall(world, "P9 backend port", mode="hybrid", client=client)
        by_id = {h["memory_id"]: h for h in hits}
        assert hits[0]["memory_id"] == exact.memory_id and hits[0]["match"]["stage"] == "exact"
        fuzzy = by_id[popular.memory_id]
        assert fuzzy["match"]["stage"] != "exact" and fuzzy["match"]["scores"]["access"] > 0.5
        assert fuzzy["score"] < 1.0 <= hits[0]["score"]
        scores[client] = fuzzy["score"]
    assert 0 < scores["weighted"] - scores["client"] <= 0.09 * MAX_ACCESS_WEIGHT + 1e-6  # the weight, and its bound


def test_an_erased_subject_keeps_no_access_and_a_late_one_is_dropped(world):
    settings, ledger, gone = world["settings"], world["ledger"], world["facts"]["erased"]
    assert _serve(world, gone, 2, T0 + timedelta(days=1)).applied == 2
    assert _counts(settings)[gone.memory_id] == 2
    ledger.apply(MemoryEvent(type=EventType.ERASED, tenant=TENANT, subject="user:erase-me"))
    assert gone.memory_id not in _counts(settings)
    with pg(settings) as conn:
        assert conn.execute("SELECT count(*) FROM accesses WHERE memory_id = %s", (gone.memory_id,)).fetchone()[0] == 0
    late = _serve(world, gone, 1, T0 + timedelta(days=2))  # an access that arrives after the erasure
    assert (late.applied, late.erased) == (0, 1) and gone.memory_id not in _counts(settings)
    # the subject told again (new event, same fact id, new version): its accesses count
    back = ledger.assert_fact(TENANT, "user:erase-me", "pref.drink", "erase-me likes tea now", "tea", valid_from=T0)
    assert back.memory_id == gone.memory_id and back.version_id != gone.version_id
    assert _serve(world, back, 1, T0 + timedelta(days=3)).applied == 1
    assert _counts(settings)[gone.memory_id] == 1


def test_a_redelivered_access_batch_changes_nothing(world):
    settings, popular = world["settings"], world["facts"]["popular"]
    topic = settings.access_topic
    a = _access(TENANT, popular.memory_id, popular.version_id, "redelivered", datetime.now(UTC))
    before = _counts(settings)[popular.memory_id]
    first = world["projector"].apply_batch([decode_access_record(topic, 1, 0, encode_access(a))])
    assert first.applied == 1
    same = world["projector"].apply_batch([decode_access_record(topic, 1, 0, encode_access(a))])  # same offset
    assert (same.applied, same.skipped) == (0, 1)
    moved = world["projector"].apply_batch([decode_access_record(topic, 1, 1, encode_access(a))])  # re-sent
    assert (moved.applied, moved.duplicates) == (0, 1)
    bad = world["projector"].apply_batch([decode_access_record(topic, 1, 2, b'{"type": "memory.accessed"}')])
    assert bad.dead == 1
    assert _counts(settings)[popular.memory_id] == before + 1
    with pg(settings) as conn:
        code = conn.execute("SELECT code FROM dead_letters WHERE topic = %s", (topic,)).fetchone()[0]
    assert code == "missing_field"


def test_stats_report_the_never_retrieved_ratio(world):
    r = world["client"].get("/v1/stats", params={"tenant": TENANT}, headers={"X-API-Key": KEY})
    assert r.status_code == 200, r.text
    access = r.json()["access"]
    served = {m["memory_id"] for m in access["most_served"]}
    assert access["active_facts"] == 5 and access["served_facts"] == len(served)
    assert access["never_retrieved_ratio"] == round((5 - len(served)) / 5, 6)
    assert access["most_served"][0]["memory_id"] == world["facts"]["popular"].memory_id
    assert access["most_served"][0]["key"] == "project.notes"


def test_a_missing_access_topic_drops_and_counts_and_recall_does_not_notice(world):
    settings, recorder = world["settings"], world["client"].app.state.resources.access
    before = recorder.dropped_by["unavailable"]
    hits = _recall(world, "P9 backend port", mode="hybrid")
    assert hits
    wait_for(lambda: recorder.dropped_by["unavailable"] >= before + len(hits), 30, 0.2, "the drop to be counted")
    assert recorder.recorded == 0
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:  # the broker allows auto-creation: the recorder must never ask for it
        assert settings.access_topic not in admin.list_topics()
    finally:
        admin.close()


def test_an_unreachable_broker_never_slows_or_fails_a_recall(world):
    settings = world["settings"].model_copy(update={"kafka_bootstrap": "127.0.0.1:1"})
    before = REGISTRY.get_sample_value("ledger_access_dropped_total", {"reason": "unavailable"}) or 0.0
    with TestClient(create_app(settings)) as client:
        recorder = client.app.state.resources.access
        served, times = 0, []
        for _ in range(10):
            started = time.perf_counter()
            r = client.post(
                "/v1/recall",
                # no rerank: its own budget (up to LEDGER_RERANK_BUDGET_MS) is not what this bound is about
                json={"tenant": TENANT, "query": "P9 backend port", "mode": "hybrid", "rerank": False},
                headers={"X-API-Key": KEY},
            )
            times.append(time.perf_counter() - started)
            assert r.status_code == 200, r.text
            served += len(r.json()["hits"])
        assert served >= 10 and max(times) < 1.0, times  # the flush thread is trying to connect meanwhile
        wait_for(lambda: recorder.dropped >= served, 30, 0.2, "every access to be dropped and counted")
        assert recorder.recorded == 0 and recorder.dropped == recorder.dropped_by["unavailable"] == served
    after = REGISTRY.get_sample_value("ledger_access_dropped_total", {"reason": "unavailable"})
    assert after is not None and after >= before + served


def test_the_access_positions_are_kept_per_topic_beside_the_ledgers(world):
    settings = world["settings"]
    stored = read_positions(settings, consumer="access-tests", topic=settings.access_topic)
    assert stored and all(o > 0 for o in stored.values())
    assert read_positions(settings, consumer="access-tests", topic=settings.topic) == {}

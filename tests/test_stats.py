"""`/v1/stats` from counters, `/v1/stats/consistency` from scans, on the real pipeline.

One private pipeline for the module (SDK -> Kafka -> worker process -> PostgreSQL -> `ledger indexer` process ->
Elasticsearch -> the app). After each step (ingest, a redelivery, retractions and confirmations, an erasure, a
worker killed with SIGKILL and restarted, a rebuild) the counters must equal a recount of their rows that this
test makes itself, in one snapshot, and `/v1/stats` must report them. Then the checks must be able to fail: a
deleted index document and a document PostgreSQL does not know are orphans, a row written behind the recorder's
back is counter drift, a broken supersession link is a chain violation.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from elasticsearch import Elasticsearch

from producers.contract import EventType, encode
from producers.settings import Settings
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.support import (
    Pipeline,
    Worker,
    asserted,
    erased,
    marked,
    pg,
    pipeline,
    publish,
    publish_raw,
    wait_for,
)

H = {"X-API-Key": "dev-key"}
TENANTS = ("acme", "globex")


@pytest.fixture(scope="module")
def pipe(base_settings: Settings) -> Iterator[Pipeline]:
    settings = base_settings.private(unique("st"), processor_batch_size=100)
    with pipeline(settings, seed=[asserted("warmup", "k", 0, 0)], app=True, timeout=120) as p:
        yield p


def recount(settings: Settings, tenant: str) -> tuple[dict[str, int], dict[str, int]]:
    """(the counters, the rows counted) for `tenant`, read in one REPEATABLE READ snapshot by plain SQL."""
    with pg(settings) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        counted = {
            name: int(n)
            for name, n in conn.execute(
                "SELECT name, sum(n) FROM counts WHERE tenant = %s GROUP BY name",
                (tenant,),
            )
        }
        rows = {
            "events": conn.execute("SELECT count(*) FROM events WHERE tenant = %s", (tenant,)).fetchone()[0],
            "versions": conn.execute("SELECT count(*) FROM fact_versions WHERE tenant = %s", (tenant,)).fetchone()[0],
            "outbox": conn.execute("SELECT count(*) FROM search_outbox WHERE tenant = %s", (tenant,)).fetchone()[0],
            "embed_queue": conn.execute("SELECT count(*) FROM embed_queue WHERE tenant = %s", (tenant,)).fetchone()[0],
            f"dead_letters/{settings.topic}": conn.execute(
                "SELECT count(*) FROM dead_letters WHERE topic = %s AND tenant = %s", (settings.topic, tenant)
            ).fetchone()[0],
        }
    return {k: counted.get(k, 0) for k in rows}, rows


def stats(pipe: Pipeline, tenant: str) -> dict[str, Any]:
    r = pipe.client.get("/v1/stats", params={"tenant": tenant}, headers=H)
    assert r.status_code == 200, r.text
    return r.json()


def consistency(pipe: Pipeline, tenant: str) -> dict[str, Any]:
    r = pipe.client.get("/v1/stats/consistency", params={"tenant": tenant}, headers=H)
    assert r.status_code == 200, r.text
    return r.json()


def check_counts(pipe: Pipeline, step: str) -> dict[str, dict[str, int]]:
    """Settled: for each tenant the counters equal the rows, /v1/stats reports them, the consistency check agrees."""
    pipe.settle()
    seen = {}
    for tenant in TENANTS:
        counted, rows = recount(pipe.settings, tenant)
        assert counted == rows, f"{step}, {tenant}: counters {counted} != rows {rows}"
        body = stats(pipe, tenant)
        reported = {
            "events": body["events_applied"],
            "versions": body["versions"],
            "outbox": body["search"]["outbox_pending"],
            "embed_queue": body["search"]["vectors_pending"],
            f"dead_letters/{pipe.settings.topic}": body["dlq_count"],
        }
        assert body["search_pending"] == rows["outbox"] + rows["embed_queue"]  # documents and vectors
        assert reported == rows, f"{step}, {tenant}: /v1/stats {reported} != rows {rows}"
        assert body["search"] == {
            "outbox_pending": 0,
            "pg_versions": rows["versions"],
            "es_documents": rows["versions"],
            "vectors_pending": 0,  # settled means every document has its vectors too
            "documents_lag_s": None,
            "vectors_lag_s": None,
            "duplicate_groups": 0,
            "duplicate_episodes": 0,
        }
        invariants = ("double_active", "chain_integrity_violations", "explicit_confidence_violations")
        assert [body[k] for k in invariants] == [0, 0, 0], body
        full = consistency(pipe, tenant)
        assert full["consistent"] is True and full["counter_drift"] == {}, f"{step}, {tenant}: {full}"
        seen[tenant] = rows
    return seen


def test_counters_equal_a_recount_through_ingest_redelivery_marks_erasure_restart_and_rebuild(pipe: Pipeline):
    s = pipe.settings
    run = uuid.uuid4().hex[:6]
    subjects = {t: [f"user:{run}-{i}" for i in range(8)] for t in TENANTS}
    start = check_counts(pipe, "start")  # the pipeline's warm-up fact

    # ingest: both tenants, updates (supersessions), an invalid record (a dead letter)
    first = [
        asserted(sub, key, f"{key}-{day}", day, tenant=t)
        for t in TENANTS
        for sub in subjects[t]
        for key in ("a", "b")
        for day in (0, 1)
    ]
    publish(s, first)
    # two refused records: one naming acme (its dead letter), one whose tenant cannot be read (no tenant's)
    publish_raw(s, [(b"x", b'{"type": "memory.asserted", "tenant": "acme"}'), (b"y", b'{"tenant": "globex"')])
    after_ingest = check_counts(pipe, "ingest")
    assert after_ingest["acme"]["versions"] == start["acme"]["versions"] + 32
    assert after_ingest["globex"]["events"] == start["globex"]["events"] + 32
    assert after_ingest["acme"][f"dead_letters/{s.topic}"] == start["acme"][f"dead_letters/{s.topic}"] + 1
    assert after_ingest["globex"][f"dead_letters/{s.topic}"] == start["globex"][f"dead_letters/{s.topic}"]  # not acme's
    assert stats(pipe, "globex")["dlq_count"] == 0 and stats(pipe, "acme")["dlq_count"] == 1

    # redelivery: the same bytes again at new offsets (same event ids): nothing changes
    publish_raw(s, [(e.kafka_key, encode(e)) for e in first[:10]])
    assert check_counts(pipe, "redelivery") == after_ingest

    # retractions and confirmations: events, outbox churn, no new versions
    marks = [marked(EventType.RETRACTED, sub, "a", 2, tenant=t) for t in TENANTS for sub in subjects[t][:3]]
    marks += [marked(EventType.CONFIRMED, sub, "b", 2, tenant=t) for t in TENANTS for sub in subjects[t][3:5]]
    publish(s, marks)
    after_marks = check_counts(pipe, "retraction")
    assert after_marks["acme"]["events"] == after_ingest["acme"]["events"] + 5
    assert after_marks["acme"]["versions"] == after_ingest["acme"]["versions"]

    # erasure: the subject's versions and events go (its tombstone stays), the index forgets it
    publish(s, [erased(subjects["acme"][0], tenant="acme")])
    after_erasure = check_counts(pipe, "erasure")
    assert after_erasure["acme"]["versions"] == after_marks["acme"]["versions"] - 4
    assert after_erasure["globex"] == after_marks["globex"]

    # a worker killed (SIGKILL) while it applies a burst, then restarted: exactly once, counters included
    burst = [asserted(f"user:{run}-burst-{i}", "k", i, 3, tenant=TENANTS[i % 2]) for i in range(600)]
    publish(s, burst)
    assert pipe.worker is not None
    pipe.worker.kill()
    pipe.worker = Worker(s).start()
    after_restart = check_counts(pipe, "worker restart")
    assert after_restart["acme"]["versions"] == after_erasure["acme"]["versions"] + 300

    # a rebuild replays the ledger into a fresh schema: its counters come out the same
    report = rebuild(s, keep_old=False)
    assert report.live_checksum == report.rebuilt_checksum
    for tenant in TENANTS:
        counted, rows = recount(s, tenant)
        assert counted == rows and rows["versions"] == after_restart[tenant]["versions"], (tenant, counted, rows)


def test_stats_reads_an_index_not_the_rows(pipe: Pipeline):
    """The row-local invariants are counted from the partial index that holds only offending rows."""
    from projections.postgres.stats import _STATS

    with pg(pipe.settings) as conn:
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN " + _STATS, {"tenant": "acme", "dead": "x", "cap": 1001}).fetchall()
        )
    assert "fact_versions_suspect" in plan, plan
    assert "Seq Scan on fact_versions" not in plan, plan


def test_consistency_finds_orphans_drift_and_broken_links(pipe: Pipeline):
    s = pipe.settings
    sub = f"user:{uuid.uuid4().hex[:6]}"
    publish(s, [asserted(sub, "k", 1, 0, tenant="globex"), asserted(sub, "k", 2, 1, tenant="globex")])
    pipe.settle()
    healthy = consistency(pipe, "globex")
    assert healthy["consistent"] is True
    assert healthy["scanned"]["elasticsearch_documents"] == healthy["search"]["es_documents"] > 0
    assert healthy["scanned"]["postgres_rows"]["fact_versions"] == healthy["counters"]["versions"]["recounted"]
    assert healthy["took_ms"]["total"] >= healthy["took_ms"]["postgres"] > 0

    with pg(s) as conn:
        (victim,) = conn.execute(
            "SELECT version_id FROM fact_versions WHERE tenant = 'globex' AND subject = %s AND version = 1", (sub,)
        ).fetchone()
    es = Elasticsearch(s.es_url, request_timeout=30)
    try:
        es.delete(index=s.es_index, id=victim, refresh=True)  # in PostgreSQL only now
        stray = "stray-" + uuid.uuid4().hex
        es.index(index=s.es_index, id=stray, document={"tenant": "globex", "subject": sub}, refresh=True)
        broken = consistency(pipe, "globex")
        assert broken["consistent"] is False
        assert (broken["search"]["missing_in_es"], broken["search"]["missing_in_pg"]) == (1, 1), broken["search"]
        assert broken["search"]["examples"] == {"missing_in_es": [victim], "missing_in_pg": [stray]}
        cheap = stats(pipe, "globex")
        assert cheap["search"]["es_documents"] == cheap["search"]["pg_versions"]  # -1 +1: only the scan tells
    finally:
        es.options(ignore_status=404).delete(index=s.es_index, id=stray, refresh=True)
        es.close()

    with pg(s) as conn:
        # a row behind the recorder's back: the counter does not know it
        payload = orjson.dumps({"note": "not through the recorder"}).decode()
        conn.execute(
            'INSERT INTO events (tenant, event_id, fingerprint, subject, type, kind, "partition", "offset", '
            "observed_at, payload) VALUES ('globex', %s, 'x', %s, 'memory.asserted', 'state', 99, %s, now(), %s)",
            (uuid.uuid4().hex, sub, 10**9 + uuid.uuid4().int % 10**6, payload),
        )
        # a version marked superseded without a successor link (the CHECK constraints still hold)
        conn.execute(
            "UPDATE fact_versions SET status = 'superseded' WHERE tenant = 'globex' AND subject = %s AND version = 2",
            (sub,),
        )
    drifted = consistency(pipe, "globex")
    # and the version's status changed behind its back: the fact no longer counts as active (the access counters)
    assert drifted["counter_drift"] == {"events_applied": -1, "facts_active": 1}, drifted["counters"]
    assert drifted["invariants"]["chain_integrity_violations"] >= 1
    cheap = stats(pipe, "globex")
    assert cheap["chain_integrity_violations"] == 1 and cheap["invariants_capped"] is False


def test_stats_say_how_long_each_store_took(pipe: Pipeline):
    body = stats(pipe, "acme")
    took = body["took_ms"]
    assert set(took) == {"postgres", "access", "elasticsearch", "kafka", "total"}
    assert took["total"] >= max(took["postgres"], took["elasticsearch"], took["kafka"]) > 0
    wait_for(lambda: stats(pipe, "acme")["total_lag"] == 0, 30, 0.5, "no lag")

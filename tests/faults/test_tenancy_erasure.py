"""Tenant isolation on every endpoint and recall mode, and erasure of a subject, through the whole pipeline.

One module pipeline (`tests.support.pipeline`): events go through the SDK to a private topic, the
projector subprocess applies them to PostgreSQL, `ledger indexer` (a subprocess) fills a private
index, and the app (create_app + TestClient) answers with keys bound to one tenant each.

Tenancy: two tenants hold facts about the SAME subjects and keys (different values). Each key must
get 403 naming the other tenant on every endpoint, and never see the other tenant's data through
its own, in any recall mode. Erasure: DELETE /v1/subjects/{subject} publishes subject.erased;
afterwards no PostgreSQL row (but the tombstone), no document and no recall hit remain for that
subject of that tenant (the same subject of another tenant is untouched), and rebuilding
PostgreSQL from the log and the index from PostgreSQL does not bring it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson
import psycopg
import pytest
from elasticsearch import Elasticsearch
from kafka import KafkaConsumer, TopicPartition

from producers.contract import EventType, MemoryEvent, memory_id_for
from producers.settings import Settings
from projections.embedding import load_embedder
from projections.search.reindex import orphans, reindex
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.faults.support import TALLY
from tests.support import Pipeline as Running
from tests.support import end_offsets, pg, pipeline, wait_for

A, B = "tenant-a", "tenant-b"
KEYS = {"key-a": [A], "key-b": [B]}
HEADERS = {A: {"X-API-Key": "key-a"}, B: {"X-API-Key": "key-b"}}
OTHER = {A: B, B: A}
MODES = ("auto", "exact", "keyword", "semantic", "hybrid")
T0 = datetime(2026, 1, 10, 9, 0, tzinfo=UTC)
VICTIM, BYSTANDER = "user:victim", "user:bystander"
VALUES = {A: {"port": 8080, "city": "Lyon"}, B: {"port": 9090, "city": "Oslo"}}
QUERIES = ["P1 backend port", "P1 的后端服务端口是多少", "which port does the backend of P1 listen on", "P1 port"]


def tenant_facts(tenant: str) -> list[MemoryEvent]:
    """The same subjects and keys in both tenants, with values that tell them apart."""
    v = VALUES[tenant]
    common = {"tenant": tenant, "type": EventType.ASSERTED, "source": {"type": "explicit", "service": "faults"}}
    return [
        MemoryEvent(
            **common,
            subject="project:P1",
            key="project.backend_port",
            value=v["port"] - 1,
            content=f"P1 的后端服务端口是 {v['port'] - 1} (backend port of P1)",
            aliases=["端口", "backend port", "port"],
            entities=["P1"],
            observed_at=T0,
        ),
        MemoryEvent(
            **common,
            subject="project:P1",
            key="project.backend_port",
            value=v["port"],
            content=f"P1 的后端服务端口是 {v['port']} (backend port of P1)",
            aliases=["端口", "backend port", "port"],
            entities=["P1"],
            observed_at=T0 + timedelta(days=1),
        ),
        MemoryEvent(
            **common,
            subject=VICTIM,
            key="profile.city",
            value=v["city"],
            content=f"the victim lives in {v['city']}",
            aliases=["city", "住址"],
            entities=["VICTIM1"],
            observed_at=T0,
        ),
        MemoryEvent(
            **common,
            subject=VICTIM,
            key="profile.city",
            value=v["city"] + "-2",
            content=f"the victim moved to {v['city']}-2",
            aliases=["city", "住址"],
            entities=["VICTIM1"],
            observed_at=T0 + timedelta(days=2),
        ),
        MemoryEvent(
            **common,
            subject=VICTIM,
            kind="episodic",
            content=f"the victim called support about the {v['city']} office",
            entities=["VICTIM1"],
            observed_at=T0 + timedelta(days=3),
        ),
        MemoryEvent(
            **common,
            subject=VICTIM,
            key="pref.drink",
            kind="preference",
            value="tea",
            content="the victim prefers tea",
            observed_at=T0,
        ),
        MemoryEvent(
            **common,
            subject=BYSTANDER,
            key="profile.city",
            value=v["city"],
            content=f"the bystander lives in {v['city']} too",
            aliases=["city"],
            observed_at=T0,
        ),
    ]


@dataclass
class Pipeline:
    """The module's running pipeline and the events it was fed, by tenant."""

    running: Running
    events: dict[str, list[MemoryEvent]]

    @property
    def settings(self) -> Settings:
        return self.running.settings

    def call(self, method: str, url: str, tenant: str | None, **kw):
        assert self.running.client is not None
        r = self.running.client.request(method, url, headers=HEADERS[tenant] if tenant else {}, **kw)
        TALLY.add(http_requests=1, http_5xx=int(r.status_code >= 500))
        return r

    def settle(self) -> None:
        """The projector and the indexer have caught up with everything published (and the index is refreshed)."""
        self.running.settle(timeout=90)


def pg_count(settings: Settings, query: str, *args) -> int:
    with pg(settings) as conn:
        return conn.execute(query, args).fetchone()[0]


def es_count(settings: Settings, tenant: str, subject: str) -> int:
    es = Elasticsearch(settings.es_url, request_timeout=30)
    try:
        es.indices.refresh(index=settings.es_index)
        query = {"bool": {"filter": [{"term": {"tenant": tenant}}, {"term": {"subject": subject}}]}}
        return es.count(index=settings.es_index, query=query)["count"]
    finally:
        es.close()


@pytest.fixture(scope="module")
def pipe(base_settings: Settings) -> Iterator[Pipeline]:
    settings = base_settings.private(unique("tenancy"), api_keys=KEYS)
    events = {t: tenant_facts(t) for t in (A, B)}
    seed = events[A] + events[B]
    with pipeline(settings, seed=seed, app=True) as running:
        TALLY.add(events_injected=len(seed))
        yield Pipeline(running, events)


# -- tenancy ------------------------------------------------------------------------------------------


def read_calls(tenant: str) -> list[tuple[str, str, dict]]:
    """Every tenant-scoped read, naming `tenant`."""
    mid = memory_id_for(tenant, "project:P1", "project.backend_port")
    calls = [
        ("GET", "/v1/subjects/project:P1/facts", {"params": {"tenant": tenant}}),
        ("GET", f"/v1/subjects/{VICTIM}/facts", {"params": {"tenant": tenant, "as_of": "2026-01-11T00:00:00Z"}}),
        ("GET", "/v1/subjects/project:P1/events", {"params": {"tenant": tenant}}),
        ("GET", f"/v1/facts/{mid}/history", {"params": {"tenant": tenant}}),
        ("GET", "/v1/stats", {"params": {"tenant": tenant}}),
        ("GET", "/v1/stats/consistency", {"params": {"tenant": tenant}}),
        ("GET", "/v1/subjects", {"params": {"tenant": tenant, "prefix": "project:"}}),
        ("POST", "/v1/context", {"json": {"tenant": tenant, "subject": "project:P1", "question": "P1 backend port"}}),
    ]
    for mode in MODES:
        calls.append(("POST", "/v1/recall", {"json": {"tenant": tenant, "query": "P1 backend port", "mode": mode}}))
        calls.append(
            (
                "POST",
                "/v1/recall",
                {"json": {"tenant": tenant, "subject": "project:P1", "query": "后端服务端口", "mode": mode}},
            )
        )
    return calls


def write_calls(tenant: str) -> list[tuple[str, str, dict]]:
    event = {
        "type": "memory.asserted",
        "tenant": tenant,
        "subject": "project:P1",
        "key": "project.backend_port",
        "value": 1,
        "content": "an intruder's port",
    }
    return [
        ("POST", "/v1/events", {"json": {"events": [event]}}),
        ("DELETE", "/v1/subjects/project:P1", {"params": {"tenant": tenant}}),
    ]


@pytest.mark.parametrize("caller", [A, B])
def test_a_key_naming_the_other_tenant_gets_403_everywhere_and_nothing_is_published(pipe: Pipeline, caller: str):
    before = end_offsets(pipe.settings)
    other = OTHER[caller]
    for method, url, kw in read_calls(other) + write_calls(other):
        r = pipe.call(method, url, caller, **kw)
        assert r.status_code == 403, f"{caller}'s key on {method} {url} naming {other}: {r.status_code} {r.text[:300]}"
        assert "tenant" in r.text
        r = pipe.call(method, url, None, **kw)  # and no key at all
        assert r.status_code == 401, f"no key on {method} {url}: {r.status_code}"
    # a batch with one foreign event among own events is refused whole
    own = {**write_calls(caller)[0][2]["json"]["events"][0], "content": "own"}
    foreign = {**own, "tenant": other}
    r = pipe.call("POST", "/v1/events", caller, json={"events": [own, foreign]})
    assert r.status_code == 403 and "events.1.tenant" in r.text
    assert end_offsets(pipe.settings) == before, "a refused request published something"


@pytest.mark.parametrize("caller", [A, B])
def test_own_key_sees_only_own_data_for_identical_subjects_and_keys(pipe: Pipeline, caller: str):
    mine, theirs = VALUES[caller], VALUES[OTHER[caller]]
    foreign_ids = {e.event_id for e in pipe.events[OTHER[caller]]}
    foreign_mids = {e.memory_id for e in pipe.events[OTHER[caller]]}
    own_ids = {e.event_id for e in pipe.events[caller]}

    r = pipe.call("GET", "/v1/subjects/project:P1/facts", caller, params={"tenant": caller})
    assert r.status_code == 200
    facts = r.json()["facts"]
    assert [f["value"] for f in facts] == [mine["port"]] and all(f["tenant"] == caller for f in facts)

    r = pipe.call("GET", "/v1/subjects/project:P1/events", caller, params={"tenant": caller})
    got = {e["event_id"] for e in r.json()["events"]}
    assert got and got <= own_ids and not got & foreign_ids

    foreign_mid = memory_id_for(OTHER[caller], "project:P1", "project.backend_port")
    r = pipe.call("GET", f"/v1/facts/{foreign_mid}/history", caller, params={"tenant": caller})
    assert r.status_code == 404, "another tenant's memory_id must not be readable under one's own tenant"
    own_mid = memory_id_for(caller, "project:P1", "project.backend_port")
    r = pipe.call("GET", f"/v1/facts/{own_mid}/history", caller, params={"tenant": caller})
    assert [v["value"] for v in r.json()["versions"]] == [mine["port"] - 1, mine["port"]]

    r = pipe.call("GET", "/v1/stats", caller, params={"tenant": caller})
    assert r.status_code == 200
    stats, n = r.json(), len(pipe.events[caller])
    assert (stats["events_applied"], stats["versions"], stats["double_active"]) == (n, n, 0), stats
    assert stats["search"]["es_documents"] == stats["search"]["pg_versions"] == n, stats["search"]
    assert foreign_mid not in r.text

    leaks = []
    for mode in MODES:
        for query in QUERIES:
            for subject in (None, "project:P1"):
                payload = {"tenant": caller, "query": query, "mode": mode, "top_k": 20}
                if subject:
                    payload["subject"] = subject
                r = pipe.call("POST", "/v1/recall", caller, json=payload)
                assert r.status_code == 200, f"{mode} {query!r}: {r.status_code} {r.text[:300]}"
                for hit in r.json()["hits"]:
                    if hit["memory_id"] in foreign_mids or hit["value"] in (theirs["port"], theirs["port"] - 1):
                        leaks.append((mode, query, hit["memory_id"], hit["value"]))
                    if hit["memory_id"] == own_mid:
                        assert hit["value"] == mine["port"], "recall returned a superseded value as current"
    assert not leaks, f"recall leaked the other tenant's data: {leaks[:5]}"
    # the exact stage finds the own fact (so the isolation check above is not vacuous)
    r = pipe.call("POST", "/v1/recall", caller, json={"tenant": caller, "query": "P1 backend port", "mode": "exact"})
    assert own_mid in {h["memory_id"] for h in r.json()["hits"]}


# -- erasure ------------------------------------------------------------------------------------------------


def check_erased(pipe: Pipeline, tenant: str, subject: str) -> None:
    s = pipe.settings
    assert pg_count(s, "SELECT count(*) FROM fact_versions WHERE tenant = %s AND subject = %s", tenant, subject) == 0
    q = "SELECT count(*) FROM events WHERE tenant = %s AND subject = %s AND type <> 'subject.erased'"
    assert pg_count(s, q, tenant, subject) == 0
    q = "SELECT count(*) FROM events WHERE tenant = %s AND subject = %s AND type = 'subject.erased'"
    assert pg_count(s, q, tenant, subject) >= 1, "the erasure tombstone stays in the audit log"
    q = "SELECT count(*) FROM search_outbox WHERE tenant = %s AND subject = %s AND op = 'upsert'"
    assert pg_count(s, q, tenant, subject) == 0
    assert es_count(s, tenant, subject) == 0, "documents of the erased subject are still in the index"
    r = pipe.call("GET", f"/v1/subjects/{subject}/facts", tenant, params={"tenant": tenant})
    assert r.status_code == 200 and r.json()["facts"] == []
    r = pipe.call("GET", f"/v1/subjects/{subject}/events", tenant, params={"tenant": tenant})
    assert [e["type"] for e in r.json()["events"]] == ["subject.erased"] * len(r.json()["events"])
    for mode in MODES:
        for query in ("where does the victim live", "VICTIM1 city", "victim prefers tea", "住址"):
            for subj in (None, subject):
                payload = {"tenant": tenant, "query": query, "mode": mode, "top_k": 50}
                if subj:
                    payload["subject"] = subj
                r = pipe.call("POST", "/v1/recall", tenant, json=payload)
                assert r.status_code == 200
                hits = [h for h in r.json()["hits"] if h["subject"] == subject]
                assert hits == [], f"recall ({mode}) still finds the erased subject: {hits[:2]}"


def check_intact(pipe: Pipeline, tenant: str, subject: str, versions: int) -> None:
    q = "SELECT count(*) FROM fact_versions WHERE tenant = %s AND subject = %s"
    assert pg_count(pipe.settings, q, tenant, subject) == versions
    assert es_count(pipe.settings, tenant, subject) == versions


def tombstone_on_the_log(settings: Settings, partition: int, offset: int) -> dict:
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = TopicPartition(settings.topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        records = wait_for(lambda: consumer.poll(timeout_ms=500).get(tp), 30, 0, "the erasure record")
        return orjson.loads(records[0].value)
    finally:
        consumer.close()


def test_erasure_purges_the_subject_everywhere_and_a_rebuild_does_not_bring_it_back(pipe: Pipeline) -> None:
    s = pipe.settings
    victim_versions = sum(1 for e in pipe.events[A] if e.subject == VICTIM)
    # before: the victim is there (so the checks below can fail)
    check_intact(pipe, A, VICTIM, victim_versions)
    r = pipe.call("POST", "/v1/recall", A, json={"tenant": A, "query": "VICTIM1 city", "subject": VICTIM})
    assert any(h["subject"] == VICTIM for h in r.json()["hits"])

    r = pipe.call("DELETE", f"/v1/subjects/{VICTIM}", A, params={"tenant": A, "reason": "GDPR request 17"})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["type"] == "subject.erased" and body["subject"] == VICTIM and body["tenant"] == A
    record = tombstone_on_the_log(s, body["partition"], body["offset"])
    assert (record["event_id"], record["type"], record["tenant"], record["subject"]) == (
        body["event_id"],
        "subject.erased",
        A,
        VICTIM,
    )
    assert record["reason"] == "GDPR request 17"
    TALLY.add(events_injected=1)
    pipe.settle()

    check_erased(pipe, A, VICTIM)
    check_intact(pipe, A, BYSTANDER, 1)
    check_intact(pipe, B, VICTIM, sum(1 for e in pipe.events[B] if e.subject == VICTIM))  # same subject, other tenant

    # rebuild PostgreSQL from offset 0 of the log (under the running worker), then the index from PostgreSQL
    report = rebuild(s, keep_old=False)
    assert report.live_checksum == report.rebuilt_checksum
    pipe.settle()  # the rebuild queues every version for re-indexing; let the indexer drain it
    check_erased(pipe, A, VICTIM)
    es = Elasticsearch(s.es_url, request_timeout=60)
    try:
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            reindex(s, conn, es, load_embedder(s))
            report = orphans(s, conn, es)
        assert report["missing_in_es"] == report["missing_in_pg"] == 0, report
    finally:
        es.close()
    check_erased(pipe, A, VICTIM)
    check_intact(pipe, B, VICTIM, sum(1 for e in pipe.events[B] if e.subject == VICTIM))

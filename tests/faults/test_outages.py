"""Outages: each server stopped (or the broker restarted) while events flow, and started again.

One private topic/schema/index for the module (`tests.support.pipeline`): the projector and
`ledger indexer` as subprocesses, and the real app (create_app + TestClient) asking GET /v1/health
during each outage.

- Elasticsearch down: PostgreSQL keeps up, the outbox holds the lag, the index catches up after,
  no orphans either way (every document has its row and every row its document).
- PostgreSQL down: the worker pauses (retries its batch) and resumes by itself; nothing lost.
- Broker restarted: producers retry through it (the SDK within its timeout, the caller with the
  same event_ids after a PublishError); the worker rides through; nothing lost.
- During each outage every route that needs the stopped store answers a prompt 503 naming it,
  and the routes that do not need it keep answering.
Servers are stopped and started through infra's own functions, and always started again.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from elasticsearch import Elasticsearch
from fastapi.testclient import TestClient

import infra.elasticsearch
from producers.contract import EventType, MemoryEvent
from producers.sdk import LedgerProducer, PublishError, PublishResult
from producers.settings import Settings
from projections.search.reindex import orphans
from tests.conftest import unique
from tests.faults.support import TALLY, ledger_state, lost_and_doubled, server_down
from tests.support import Indexer, Worker, drain_search, pipeline, wait_caught_up, wait_for

TENANT = "outage"
HEADERS = {"X-API-Key": "outage-key"}  # bound to the outage tenant only (the fixture)


@dataclass
class Stack:
    settings: Settings
    worker: Worker
    indexer: Indexer
    client: TestClient
    first_seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    assertions: set[str] = field(default_factory=set)


def facts(tag: str, n: int) -> list[MemoryEvent]:
    return [
        MemoryEvent(
            type=EventType.ASSERTED,
            tenant=TENANT,
            subject=f"svc:{tag}-{i % 50}",
            key=f"config.k{i % 7}",
            value=i,
            content=f"service {tag}-{i % 50} setting k{i % 7} is {i}",
            entities=[f"{tag.upper()}{i % 50}"],
        )
        for i in range(n)
    ]


def publish(stack: Stack, events: list[MemoryEvent], timeout_s: float = 30.0) -> None:
    with LedgerProducer(stack.settings, timeout_s=timeout_s) as producer:
        for event, result in zip(events, producer.publish_many(events), strict=True):
            stack.first_seen.setdefault(event.event_id, (result.partition, result.offset))
    stack.assertions |= {e.event_id for e in events}
    TALLY.add(events_injected=len(events))


def health(stack: Stack) -> tuple[int, dict]:
    r = stack.client.get("/v1/health")
    TALLY.add(http_requests=1, http_5xx=int(r.status_code >= 500 and r.status_code != 503))
    return r.status_code, r.json()


def wait_health(stack: Stack, down: str | None, timeout: float = 60.0) -> dict:
    """Poll /v1/health until it reports exactly `down` as failing (503), or all parts ok (200) if None."""

    def check():
        status, body = health(stack)
        failing = {name for name, part in body["parts"].items() if not part["ok"]}
        if down is None:
            return body if status == 200 and not failing else None
        return body if status == 503 and failing == {down} and body["status"] == "degraded" else None

    return wait_for(check, timeout, 0.5, f"/v1/health to report {down or 'nothing'} down")


# route -> the stores it needs; asked during each outage (a prompt 503 naming the store)
ROUTES: list[tuple[str, str, dict | None, set[str]]] = [
    ("GET", f"/v1/subjects/svc:warm-1/facts?tenant={TENANT}", None, {"postgres"}),
    ("GET", f"/v1/subjects/svc:warm-1/facts?tenant={TENANT}&as_of=2026-01-01T00:00:00Z", None, {"postgres"}),
    ("GET", f"/v1/subjects/svc:warm-1/events?tenant={TENANT}", None, {"postgres"}),
    ("GET", f"/v1/facts/0123456789abcdef0123456789abcdef/history?tenant={TENANT}", None, {"postgres"}),
    ("GET", f"/v1/stats?tenant={TENANT}", None, {"postgres"}),
    # an exact question naming an entity id is answered from PostgreSQL's current state: the index may be down
    ("POST", "/v1/recall", {"tenant": TENANT, "query": "WARM1 setting k1"}, {"postgres"}),
    (
        "POST",
        "/v1/recall",
        {"tenant": TENANT, "query": "service warm setting", "mode": "keyword"},
        {"postgres", "elasticsearch"},
    ),
    ("DELETE", f"/v1/subjects/svc:none?tenant={TENANT}", None, {"kafka"}),
]


def check_routes_during_outage(stack: Stack, down: str, budget_s: float = 8.0) -> None:
    """Each route that needs `down` answers 503 naming it within `budget_s`; the others do not fail."""
    for method, path, body, needs in ROUTES:
        if down not in needs:
            continue
        t0 = time.monotonic()
        r = stack.client.request(method, path, json=body, headers=HEADERS)
        took = time.monotonic() - t0
        TALLY.add(http_requests=1, http_5xx=int(r.status_code >= 500 and r.status_code != 503))
        assert r.status_code == 503, (method, path, r.status_code, r.text[:300])
        assert down in r.text.lower(), f"{method} {path}: the 503 does not name {down}: {r.text[:300]}"
        detail = r.json()["detail"]
        assert isinstance(detail, list) and detail[0]["code"] and "message" in detail[0], r.text[:300]
        assert took < budget_s, f"{method} {path} took {took:.1f}s to say {down} is down"


def outbox(settings: Settings) -> int:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return conn.execute(f'SELECT count(*) FROM "{settings.pg_schema}".search_outbox').fetchone()[0]


def check_nothing_lost(stack: Stack, *, check_positions: bool = True) -> None:
    state = ledger_state(stack.settings)
    lost, doubled, unexpected = lost_and_doubled(
        state, stack.first_seen, stack.assertions, check_positions=check_positions
    )
    TALLY.add(events_lost=len(lost), events_applied_twice=len(doubled))
    assert not lost, f"{len(lost)} events lost, e.g. {sorted(lost)[:5]}"
    assert not doubled, f"{len(doubled)} applied twice, e.g. {sorted(doubled)[:5]}"
    assert not unexpected, f"{len(unexpected)} events never acknowledged, e.g. {sorted(unexpected)[:5]}"


def orphan_report(settings: Settings) -> dict:
    """projections.search.reindex.orphans (what /v1/stats reports), all tenants of the private schema."""
    es = Elasticsearch(settings.es_url, request_timeout=30)
    try:
        es.indices.refresh(index=settings.es_index)
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            return orphans(settings, conn, es)
    finally:
        es.close()


def check_index_caught_up(stack: Stack, stall: float = 120.0) -> None:
    """The outbox and the embed queue drain to empty (waited for while they shrink: after an outage the whole
    backlog waits for the index, at the host's pace) and the index holds exactly PostgreSQL's versions."""
    drain_search(stack.settings, stall, stack.indexer.check)  # AssertionError with its log if the indexer died
    report = orphan_report(stack.settings)
    assert report["missing_in_pg"] == 0, f"orphan documents (no PostgreSQL row): {report}"
    assert report["missing_in_es"] == 0, f"versions missing from the index: {report}"
    assert report["outbox_pending"] == 0 and report["es_documents"] == report["pg_versions"] > 0, report


@pytest.fixture(scope="module")
def stack(base_settings: Settings) -> Iterator[Stack]:
    settings = base_settings.private(unique("outage"), api_keys={"outage-key": [TENANT]})
    with pipeline(settings, app=True) as pipe:
        assert pipe.worker is not None and pipe.indexer is not None and pipe.client is not None
        s = Stack(pipe.settings, pipe.worker, pipe.indexer, pipe.client)
        publish(s, facts("warm", 20))
        wait_caught_up(s.settings, timeout=90, worker=s.worker)
        check_index_caught_up(s)
        wait_health(s, None)
        yield s


def test_elasticsearch_down_postgres_keeps_up_and_the_index_catches_up(stack: Stack) -> None:
    publish(stack, facts("es-before", 100))
    t0 = time.monotonic()
    with server_down("elasticsearch", stack.settings):
        body = wait_health(stack, "elasticsearch")
        TALLY.timings_s["es_stop_to_health_503"] = round(time.monotonic() - t0, 1)
        assert body["parts"]["postgres"]["ok"] and body["parts"]["kafka"]["ok"]
        check_routes_during_outage(stack, "elasticsearch")
        r = stack.client.get(f"/v1/subjects/svc:warm-1/facts?tenant={TENANT}", headers=HEADERS)
        assert r.status_code == 200, "reading facts needs only PostgreSQL"
        publish(stack, facts("es-during", 400))
        wait_caught_up(stack.settings, timeout=60, worker=stack.worker)  # PostgreSQL keeps up without ES
        assert outbox(stack.settings) > 0, "the lag must wait in the outbox while the index is away"
        check_nothing_lost(stack)
        TALLY.timings_s["es_down_work_done"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    wait_health(stack, None)
    TALLY.timings_s["es_health_ok_after_restart"] = round(time.monotonic() - t0, 1)
    node = infra.elasticsearch.pid(stack.settings)  # restarted by infra, in a session of its own, not the caller's
    assert node is not None and os.getsid(node) != os.getsid(0)
    check_index_caught_up(stack, stall=120)
    TALLY.timings_s["es_index_caught_up_after_restart"] = round(time.monotonic() - t0, 1)
    check_nothing_lost(stack)


def test_postgres_down_processing_pauses_and_resumes(stack: Stack) -> None:
    mark = len(stack.worker.log())
    with server_down("postgres", stack.settings):
        wait_health(stack, "postgres")
        check_routes_during_outage(stack, "postgres")
        publish(stack, facts("pg-during", 400))  # the ledger takes writes while PostgreSQL is away
        # the worker notices, keeps its batch and retries (it must neither skip it nor exit)
        wait_for(
            lambda: "batch not applied" in stack.worker.log()[mark:] or not stack.worker.alive(),
            60,
            0.2,
            "the worker to report the failed batch",
        )
        assert stack.worker.alive(), f"the worker exited while PostgreSQL was down:\n{stack.worker.log()[-3000:]}"
    wait_caught_up(stack.settings, timeout=90, worker=stack.worker)  # resumed by itself, no restart
    wait_health(stack, None)
    check_nothing_lost(stack)
    check_index_caught_up(stack)


class GatedPublisher(threading.Thread):
    """Publishes the first half, waits for `gate` (the broker is down), then publishes the rest into the outage.

    Batches go through one SDK producer (which buffers and retries within its timeout); an event that
    still fails comes back as a PublishError and is published again with the same event_id.
    """

    def __init__(self, stack: Stack, events: list[MemoryEvent], batch: int = 50, attempts: int = 5) -> None:
        super().__init__(name="faults-broker-publisher", daemon=True)
        self.stack, self.events, self.batch, self.attempts = stack, events, batch, attempts
        self.gate = threading.Event()
        self.first_half_done = threading.Event()
        self.acked: dict[str, tuple[int, int]] = {}
        self.retried = 0
        self.failed: list[PublishError] = []

    def _publish(self, producer: LedgerProducer, events: list[MemoryEvent]) -> None:
        for start in range(0, len(events), self.batch):
            todo = events[start : start + self.batch]
            for attempt in range(self.attempts):
                again = []
                for event, outcome in zip(todo, producer.send_many(todo), strict=True):
                    if isinstance(outcome, PublishResult):
                        self.acked.setdefault(event.event_id, (outcome.partition, outcome.offset))
                    elif attempt < self.attempts - 1:
                        again.append(event)
                    else:
                        self.failed.append(outcome)
                self.retried += len(again)
                todo = again
                if not todo:
                    break

    def run(self) -> None:
        half = len(self.events) // 2
        with LedgerProducer(self.stack.settings, timeout_s=60) as producer:
            self._publish(producer, self.events[:half])
            self.first_half_done.set()
            if self.gate.wait(120):
                self._publish(producer, self.events[half:])


def test_broker_restart_producers_retry_and_nothing_is_lost(stack: Stack) -> None:
    events = facts("kafka", 600)
    publisher = GatedPublisher(stack, events)
    publisher.start()
    wait_for(publisher.first_half_done.is_set, 60, 0.05, "the first half to be acknowledged")
    with server_down("kafka", stack.settings):
        wait_health(stack, "kafka", timeout=30)
        publisher.gate.set()  # the second half is published into the outage
        check_routes_during_outage(stack, "kafka", budget_s=15.0)
        wait_for(lambda: len(publisher.acked) == len(events) // 2, 5, 0.05, "nothing acknowledged while down")
    t0 = time.monotonic()
    publisher.join(180)
    TALLY.timings_s["kafka_publisher_done_after_restart"] = round(time.monotonic() - t0, 1)
    assert not publisher.is_alive(), "the publisher did not finish after the broker came back"
    assert not publisher.failed, f"{len(publisher.failed)} events never published: {publisher.failed[0]}"
    assert len(publisher.acked) == len(events)
    stack.first_seen.update(publisher.acked)
    stack.assertions |= {e.event_id for e in events}
    TALLY.add(events_injected=len(events))
    TALLY.notes.append(
        f"broker restart: {len(events) // 2} events published into the outage, "
        f"{publisher.retried} publications retried by the caller after an SDK PublishError"
    )
    wait_health(stack, None)
    assert stack.worker.alive(), f"the worker exited across the broker restart:\n{stack.worker.log()[-3000:]}"
    wait_caught_up(stack.settings, timeout=120, worker=stack.worker)
    TALLY.timings_s["kafka_worker_caught_up_after_restart"] = round(time.monotonic() - t0, 1)
    # an event whose acknowledgement was lost in the restart may sit twice in the log (same event_id):
    # it must still be one event and one version, so positions are not compared here
    check_nothing_lost(stack, check_positions=False)
    check_index_caught_up(stack)

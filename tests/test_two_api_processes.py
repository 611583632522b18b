"""Two API processes behind one address: `ledger serve --workers 2`, uvicorn's processes sharing one port.

Nothing a request relies on lives in one process (ids are claimed in PostgreSQL, tokens are log positions, accesses
go through Kafka), so what one process guarantees holds whichever process answers. On the real stack (the module's
private ledger: SDK, worker, indexer, embedder; the API as `ledger serve --workers 2` on a free port):

- idempotency across doors: one (tenant, event_id) with two contents sent at once, one to each process: exactly one
  accepted, the other `event_id_conflict`; the worker then applies the accepted content and dead-letters nothing;
- read-your-writes: a write answered by one process, then the read with its token answered by the other (facts and
  recall): never a miss;
- access tracking: the recalls both processes serve are each recorded once (a request retried on the other process
  with the same X-Request-ID too), projected once, and the one /metrics counts what both processes recorded.

Which process answered is read from the samples each process writes itself (`ApiServer.answered`: prometheus-client's
multiprocess files, one per pid), and only requests it shows answered by the intended process count for a claim.
The kernel hands each new connection to either process; a keep-alive connection stays with its process (`_pinned`).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from producers.sdk import LedgerProducer
from producers.settings import Settings
from tests.conftest import unique
from tests.support import TENANT, Pipeline, Worker, asserted, pg, pipeline, wait_caught_up, wait_for, wire
from tests.support.servers import ApiServer
from tests.test_access import _access_caught_up
from tests.test_idempotency_doors import KEYS, _applied, _dead_letters, _id, _outcome
from tests.test_metrics import scrape, value
from tests.test_read_your_writes import _fact, _values

KEY = "key-a"  # bound to TENANT (tests.test_idempotency_doors.KEYS)
H = {"X-API-Key": KEY}
RACES = 8  # id races that reached both processes
PAIRS = 12  # write on one process, read on the other (each direction half of them)
RECALLS = 4  # per process, for access tracking
FACTS, RECALL = "/v1/subjects/{subject}/facts", "/v1/recall"


@dataclass
class Two:
    settings: Settings
    pipe: Pipeline
    api: ApiServer


@pytest.fixture(scope="module")
def two(base_settings: Settings) -> Iterator[Two]:
    settings = base_settings.private(unique("twoapi"), api_keys=KEYS)
    with pipeline(settings, seed=[asserted("user:warmup", "pref.drink", "tea")]) as pipe:
        with ApiServer(settings, workers=2) as api:
            yield Two(settings, pipe, api)


def _answered(api: ApiServer, expected: dict[tuple[str, str], int], before: dict[tuple[str, str], Counter[int]]):
    """By pid, the requests answered per (method, route) since `before`, once as many as `expected` are counted
    (a process counts a request just after its response went out)."""

    def counted() -> dict[tuple[str, str], Counter[int]] | None:
        now = {k: api.answered(*k) - before[k] for k in expected}
        return now if all(sum(now[k].values()) == n for k, n in expected.items()) else None

    return wait_for(counted, 10, 0.02, f"the processes' samples of {expected}")


def _snapshot(api: ApiServer, *keys: tuple[str, str]) -> dict[tuple[str, str], Counter[int]]:
    return {k: api.answered(*k) for k in keys}


def _pinned(api: ApiServer, tries: int = 60) -> dict[int, httpx.Client]:
    """A keep-alive connection to each of the two processes, by pid: new ones until both processes answered one."""
    clients: dict[int, httpx.Client] = {}
    health = ("GET", "/v1/health")
    for _ in range(tries):
        client = httpx.Client(base_url=api.url, headers=H, timeout=60, limits=httpx.Limits(max_connections=1))
        before = _snapshot(api, health)
        assert client.get("/v1/health").status_code == 200
        [pid] = _answered(api, {health: 1}, before)[health]
        if pid in clients:
            client.close()
        else:
            clients[pid] = client
        if len(clients) == 2:
            return clients
    raise AssertionError(f"{tries} connections all went to one process {list(clients)}")


def _close(clients: dict[int, httpx.Client]) -> None:
    for client in clients.values():
        client.close()


def _across(api: ApiServer, rounds: int, step: Callable[[dict[int, httpx.Client], int, int], Any]) -> list[Any]:
    """`step(clients, one, other)` for `rounds` rounds where the samples show `one` and `other` (two pids) answered
    what `step` meant them to; a round a re-opened connection sent elsewhere is redone on connections pinned
    again (its outcome was checked all the same)."""
    out: list[Any] = []
    clients = _pinned(api)
    try:
        for _ in range(rounds * 3):
            one, other = sorted(clients)[:: 1 if len(out) % 2 == 0 else -1]  # both directions
            result, crossed = step(clients, one, other)
            if crossed:
                out.append(result)
                if len(out) == rounds:
                    return out
            else:
                _close(clients)
                clients = _pinned(api)
    finally:
        _close(clients)
    raise AssertionError(f"only {len(out)} of {rounds} rounds reached both processes")


# -- idempotency: one id, one content, whichever process ------------------------------------------------------------


def test_an_id_raced_to_both_processes_at_once_is_accepted_once(two: Two) -> None:
    """One keep-alive connection pinned to each process, and the two contents sent from two threads released by
    one barrier, so every round reaches both processes at once (fresh connections leave the pick to the kernel,
    which on a busy host handed both to one process in most rounds); in every round exactly one is accepted."""
    api, settings = two.api, two.settings
    two.pipe.worker.stop()  # published, not applied: the claim in PostgreSQL alone decides
    events = ("POST", "/v1/events")
    winners: dict[str, str] = {}

    def race(clients: dict[int, httpx.Client], one: int, other: int) -> tuple[None, bool]:
        event_id = _id()
        sent = {
            one: wire("user:race", event_id=event_id, value="window", content="one says window"),
            other: wire("user:race", event_id=event_id, value="aisle", content="the other says aisle"),
        }
        before = _snapshot(api, events)
        start = threading.Barrier(2)

        def send(pid: int) -> dict[str, Any]:
            start.wait(timeout=30)
            return _outcome(clients[pid].post("/v1/events", json={"events": [sent[pid]]}))

        with ThreadPoolExecutor(2) as pool:
            got = dict(zip((one, other), pool.map(send, (one, other)), strict=True))
        assert sorted(g["accepted"] for g in got.values()) == [False, True], got
        [winner] = [pid for pid, g in got.items() if g["accepted"]]
        [loser] = [pid for pid, g in got.items() if not g["accepted"]]
        assert (got[loser]["code"], got[loser]["field"]) == ("event_id_conflict", "events.0.event_id"), got
        winners[event_id] = sent[winner]["content"]
        return None, _answered(api, {events: 2}, before)[events] == {one: 1, other: 1}

    try:
        _across(api, RACES, race)
    finally:  # the module's worker running and caught up again, whatever this test found: the next tests read
        two.pipe.worker = Worker(settings).start()
        wait_caught_up(settings, timeout=90, worker=two.pipe.worker)
    assert _dead_letters(settings) == [], "a process accepted an id the worker then refused"
    applied = _applied(settings)
    assert {i: applied.get(i) for i in winners} == winners


# -- read-your-writes: the write on one process, the read with its token on the other ------------------------------


def test_a_write_on_one_process_is_read_with_its_token_on_the_other(two: Two) -> None:
    api = two.api
    subject = f"user:two-{uuid.uuid4().hex[:6]}"
    keys = (("POST", "/v1/events"), ("GET", FACTS), ("POST", RECALL))
    misses: list[str] = []

    def pair(clients: dict[int, httpx.Client], writer: int, reader: int) -> tuple[None, bool]:
        value_ = f"drink-{uuid.uuid4().hex[:6]}"
        before = _snapshot(api, *keys)
        wrote = clients[writer].post("/v1/events", json={"events": [_fact(subject, value_)]})
        assert wrote.status_code == 200, wrote.text
        token = wrote.json()["consistency_token"]
        facts = clients[reader].get(f"/v1/subjects/{subject}/facts", params={"tenant": TENANT, "after": token})
        assert facts.status_code == 200, facts.text
        ask = {"tenant": TENANT, "subject": subject, "query": "favourite drink", "after": token}
        recalled = clients[reader].post(RECALL, json=ask)
        assert recalled.status_code == 200, recalled.text
        if [f["value"] for f in facts.json()["facts"]] != [value_]:
            misses.append(f"facts {value_}: {facts.json()['facts']}")
        if _values(recalled.json())[:1] != [value_]:
            misses.append(f"recall {value_}: {_values(recalled.json())}")
        seen = _answered(api, dict.fromkeys(keys, 1), before)
        crossed = seen[keys[0]] == {writer: 1} and seen[keys[1]] == seen[keys[2]] == {reader: 1}
        return None, crossed

    _across(api, PAIRS, pair)
    assert misses == []


# -- access tracking: what both processes serve, recorded once ----------------------------------------------------


def test_the_accesses_both_processes_serve_are_recorded_once(two: Two) -> None:
    api, settings = two.api, two.settings
    subject, tag = f"project:P{uuid.uuid4().hex[:4]}", uuid.uuid4().hex[:8]
    with LedgerProducer(settings) as producer:
        producer.publish_many(
            [
                asserted(subject, "project.port", 8080, content=f"{subject} listens on port 8080"),
                asserted(subject, "project.host", "db-1", content=f"{subject} is deployed on db-1"),
            ]
        )
    two.pipe.settle()
    metrics = scrape(api.url + settings.api_metrics_path)  # any process answers, with the sum of both
    recall = ("POST", RECALL)
    served: dict[str, set[tuple[str, str]]] = {}  # request id -> (memory_id, version_id) of its hits
    sent = 0  # access records the processes were handed: a retry's again

    def ask(client: httpx.Client, rid: str) -> set[tuple[str, str]]:
        nonlocal sent
        body = {"tenant": TENANT, "subject": subject, "query": f"{subject} port and host"}
        r = client.post(RECALL, json=body, headers={"X-Request-ID": rid})
        assert r.status_code == 200 and r.headers["x-request-id"] == rid, r.text
        hits = {(h["memory_id"], h["version_id"]) for h in r.json()["hits"]}
        assert hits, r.text
        sent += len(hits)
        return hits

    def round_(clients: dict[int, httpx.Client], one: int, other: int) -> tuple[None, bool]:
        rid = f"two-{tag}-{len(served)}"
        before = _snapshot(api, recall)
        served[rid] = ask(clients[one], rid)
        retried = ask(clients[other], rid)  # the same request retried through the other process
        assert retried == served[rid], (served[rid], retried)
        return None, _answered(api, {recall: 2}, before)[recall] == {one: 1, other: 1}

    _across(api, 2 * RECALLS, round_)

    def recorded() -> float | None:
        now = scrape(api.url + settings.api_metrics_path)
        done = value(now, "ledger_access_recorded_total") - value(metrics, "ledger_access_recorded_total")
        return now if done >= sent else None

    after = wait_for(recorded, 30, 0.2, f"{sent} accesses recorded by the two processes")
    assert value(after, "ledger_access_recorded_total") - value(metrics, "ledger_access_recorded_total") == sent
    for reason in ("queue_full", "unavailable", "delivery", "invalid"):
        assert value(after, "ledger_access_dropped_total", reason=reason) == 0, reason
    _access_caught_up(settings, two.pipe.worker, timeout=60)
    with pg(settings) as conn:
        rows = conn.execute(
            "SELECT request_id, memory_id, version_id FROM accesses WHERE request_id LIKE %s", (f"two-{tag}-%",)
        ).fetchall()
        counted = dict(conn.execute("SELECT memory_id, accesses FROM access_counts").fetchall())
        logged = dict(conn.execute("SELECT memory_id, count(*) FROM accesses GROUP BY memory_id").fetchall())
    expected = Counter((rid, m, v) for rid, hits in served.items() for m, v in hits)
    assert Counter(rows) == expected, "an access lost or counted twice across the two processes"
    assert counted == logged, "the access counters differ from the accesses they count"

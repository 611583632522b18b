"""One (tenant, event_id), one content, whichever door it comes through; and an event's fate by its id.

Against the real servers: two `ledger serve` processes and a `ledger mcp --transport http` process on one private
ledger, the projector (`python -m stream_processors`) started only when a test wants the events applied, so
"published but not applied yet" is the state the doors answer in (the race the reservation closes).

- every door the ledger runs (HTTP on either API process, MCP `remember`) answers the same id with another
  content as `event_id_conflict` while the first is still in flight, in either order and at once, and the
  worker then dead-letters nothing;
- `GET /v1/events/{event_id}?tenant=` (MCP `event_status`, `LedgerClient.event_status`) answers unknown,
  pending, applied (with its effect and position), dead_lettered (with the reason) and duplicate (erased),
  and never shows another tenant's id;
- after an erasure, an old id with the same content is a duplicate (`erased: true`), with other content a
  conflict: at the door, and for a publisher that writes to Kafka directly (dead-lettered as `event_id_conflict`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import orjson
import psycopg
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from api.client import AsyncLedgerClient, LedgerClient
from producers.contract import MAX_EVENT_BYTES
from producers.sdk import LedgerProducer
from producers.settings import Settings
from producers.topics import ensure_topics
from projections.postgres.schema import create_schema
from tests.conftest import unique
from tests.support import Worker, cleanup, end_offsets, pg, publish_raw, wait_caught_up, wire
from tests.support.servers import ApiServer, McpHttpServer, tool_body

A, B = "acme", "globex"
KEYS = {"key-a": [A], "key-b": [B]}


@dataclass
class Doors:
    settings: Settings
    apis: list[str]  # two `ledger serve` processes
    mcp: str  # the MCP server's Streamable HTTP endpoint
    worker: Worker

    def apply(self) -> None:
        """The projector runs (started if it was paused) and has applied everything on the topic."""
        if not self.worker.alive():
            self.worker.start()
        wait_caught_up(self.settings, timeout=90, worker=self.worker)

    def pause(self) -> None:
        """No projector runs: what the doors publish now stays published and not applied."""
        self.worker.stop()


@pytest.fixture(scope="module")
def doors(base_settings: Settings) -> Iterator[Doors]:
    """The schema exists (the doors claim ids in it) and no worker runs until a test wants events applied."""
    settings = base_settings.private(unique("doors"), api_keys=KEYS)
    ensure_topics(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    with ExitStack() as stack:
        stack.callback(cleanup, settings)
        servers = [ApiServer(settings), ApiServer(settings), McpHttpServer(settings)]
        for server in servers:  # started together, then waited for: the three start in parallel
            server.start()
            stack.callback(server.stop)
        for server in servers:
            server.wait_ready()
        worker = Worker(settings)
        stack.callback(worker.stop)
        yield Doors(settings, [servers[0].url, servers[1].url], servers[2].url, worker)


def _id() -> str:
    return f"ev-{uuid.uuid4().hex[:12]}"


async def _http(url: str, event: dict[str, Any], key: str = "key-a") -> dict[str, Any]:
    """POST /v1/events with one event: {accepted, duplicate, code, field} of its result."""
    async with httpx.AsyncClient(headers={"X-API-Key": key}, timeout=60) as http:
        return _outcome(await http.post(url + "/v1/events", json={"events": [event]}))


def _outcome(r: httpx.Response) -> dict[str, Any]:
    """{accepted, duplicate, code, field} of the one event a POST /v1/events carried."""
    assert r.status_code in (200, 422), r.text
    [res] = r.json()["results"]
    assert r.json()["idempotency_checked"] is True, r.text
    if res["accepted"]:
        return {"accepted": True, "duplicate": res["duplicate"], "erased": res.get("erased", False)}
    return {"accepted": False, "code": res["error"]["code"], "field": res["error"]["field"]}


@asynccontextmanager
async def _session(url: str, key: str = "key-a") -> AsyncIterator[Client]:
    """One MCP session over Streamable HTTP, acting with `key` (calls on it may run concurrently)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


async def _tool(mcp: Client, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    r = await mcp.call_tool(tool, arguments)
    return bool(r.is_error), tool_body(r)


async def _mcp(mcp: Client, event: dict[str, Any]) -> dict[str, Any]:
    """MCP `remember` of the same event (its fields but `type`): the result in `_http`'s terms."""
    is_error, body = await _tool(mcp, "remember", {k: v for k, v in event.items() if k != "type"})
    if not is_error:
        return {"accepted": True, "duplicate": body["duplicate"], "erased": body.get("erased", False)}
    assert body["status"] == 422, body
    return {"accepted": False, "code": body["detail"][0]["code"], "field": body["detail"][0]["field"]}


async def _one_tool(doors: Doors, tool: str, arguments: dict[str, Any], key: str = "key-a") -> tuple[bool, Any]:
    async with _session(doors.mcp, key) as mcp:
        return await _tool(mcp, tool, arguments)


def _send(doors: Doors, mcp: Client, door: str, event: dict[str, Any]) -> Any:
    return _mcp(mcp, event) if door == "mcp" else _http(doors.apis[int(door[-1])], event)


def _status(doors: Doors, event_id: str, tenant: str = A, key: str = "key-a", api: int = 0) -> httpx.Response:
    return httpx.get(
        f"{doors.apis[api]}/v1/events/{event_id}", params={"tenant": tenant}, headers={"X-API-Key": key}, timeout=30
    )


def _dead_letters(settings: Settings) -> list[tuple[Any, ...]]:
    with pg(settings) as conn:
        return conn.execute('SELECT "partition", "offset", code, field FROM dead_letters ORDER BY 1, 2').fetchall()


def _applied(settings: Settings) -> dict[str, str]:
    with pg(settings) as conn:
        rows = conn.execute("SELECT event_id, payload->>'content' FROM events WHERE tenant = %s", (A,)).fetchall()
    return dict(rows)


# -- class: one id, one content, across every door ----------------------------------------------------------------

PAIRS = [("api0", "mcp"), ("mcp", "api0"), ("api0", "api1"), ("api1", "mcp")]


def test_an_id_names_one_content_across_doors_and_api_processes(doors: Doors) -> None:
    """Two contents under one id through two doors, one after the other (both orders) and at once: exactly one is
    accepted, the other is `event_id_conflict` naming the event_id; the worker then applies the accepted one and
    dead-letters nothing. A retry of the accepted content through the other door is a duplicate."""
    doors.pause()
    winners: dict[str, str] = {}

    async def race(mcp: Client, first: str, second: str, together: bool) -> None:
        event_id = _id()
        one = wire("user:race", tenant=A, event_id=event_id, value="window", content=f"{first} says window")
        two = wire("user:race", tenant=A, event_id=event_id, value="aisle", content=f"{second} says aisle")
        if together:
            got = await asyncio.gather(_send(doors, mcp, first, one), _send(doors, mcp, second, two))
        else:
            got = [await _send(doors, mcp, first, one), await _send(doors, mcp, second, two)]
        where = f"{first} then {second}" + (" at once" if together else "")
        assert sorted(g["accepted"] for g in got) == [False, True], (where, got)
        won, lost = (0, 1) if got[0]["accepted"] else (1, 0)
        assert not together or got[won]["duplicate"] is False, (where, got)
        field = "events.0.event_id" if (first, second)[lost] != "mcp" else "event_id"
        assert (got[lost]["code"], got[lost]["field"]) == ("event_id_conflict", field), (where, got)
        winner = (one, two)[won]
        retry = await _send(doors, mcp, (first, second)[lost], winner)  # the winner's content is a retry anywhere
        assert retry["accepted"], (where, retry)
        winners[event_id] = winner["content"]

    async def scenario() -> None:
        async with _session(doors.mcp) as mcp:
            for first, second in PAIRS:
                await race(mcp, first, second, together=False)
                await race(mcp, first, second, together=True)
            # an event refused before it was sent (too large once encoded) leaves its id free for a corrected one
            event_id = _id()
            too_big = wire("user:race", tenant=A, event_id=event_id, value="y" * MAX_EVENT_BYTES)
            assert (await _http(doors.apis[1], too_big))["code"] == "too_large"
            fixed = wire("user:race", tenant=A, event_id=event_id, value="fits", content="the corrected event")
            assert (await _mcp(mcp, fixed))["accepted"]
            winners[event_id] = fixed["content"]

    asyncio.run(scenario())
    doors.apply()
    assert _dead_letters(doors.settings) == [], "a door accepted an id that the worker then refused"
    applied = _applied(doors.settings)
    assert {i: applied.get(i) for i in winners} == winners


def test_a_retry_of_an_event_not_applied_yet_says_pending_at_every_door(doors: Doors) -> None:
    """A retry answered from its first copy's publish in the same process (at once with it, or after it) is a
    duplicate whose effect is `pending` while the worker has not applied it, as its status says; `applied` only once
    it is. An answer never claims an effect before it happened."""
    doors.pause()

    async def effect(mcp: Client, door: str, event: dict[str, Any]) -> tuple[bool, str]:
        if door == "mcp":
            is_error, body = await _tool(mcp, "remember", {k: v for k, v in event.items() if k != "type"})
            assert not is_error, body
            return body["duplicate"], body["effect"]
        async with httpx.AsyncClient(headers={"X-API-Key": "key-a"}, timeout=60) as http:
            r = await http.post(doors.apis[0] + "/v1/events", json={"events": [event]})
        assert r.status_code == 200, r.text
        [res] = r.json()["results"]
        return res["duplicate"], res["effect"]

    events = {door: wire("user:retry", tenant=A, event_id=_id(), value=door) for door in ("api0", "mcp")}

    async def retried(after_apply: bool) -> list[tuple[str, bool, str]]:
        out = []
        async with _session(doors.mcp) as mcp:
            for door, event in events.items():
                sends = [effect(mcp, door, event) for _ in range(1 if after_apply else 2)]
                out += [(door, *got) for got in await asyncio.gather(*sends)]
                if not after_apply:
                    out.append((door, *await effect(mcp, door, event)))
        return out

    before = asyncio.run(retried(after_apply=False))
    assert sum(duplicate for _, duplicate, _ in before) >= 4, before  # two retries a door
    assert [effect for *_, effect in before] == ["pending"] * 6, before
    for event in events.values():
        assert _status(doors, event["event_id"]).json()["status"] == "pending"
    doors.apply()
    after = asyncio.run(retried(after_apply=True))
    assert after == [("api0", True, "applied"), ("mcp", True, "applied")], after


# -- the status of an event by its id -------------------------------------------------------------------------------


def test_event_status_answers_each_fate_and_only_to_its_tenant(doors: Doors) -> None:
    settings = doors.settings
    never, pending_id, bad_id, erased_id = _id(), _id(), _id(), _id()
    doors.pause()
    for event_id in (never, pending_id):
        r = _status(doors, event_id)
        assert r.status_code == 200, r.text
    assert _status(doors, never).json() == {"tenant": A, "event_id": never, "status": "unknown"}

    good = wire("user:status", tenant=A, event_id=pending_id, value="window")
    asyncio.run(_http(doors.apis[0], good))
    for api in (0, 1):  # either API process answers from the store, not from what it published itself
        body = _status(doors, pending_id, api=api).json()
        assert body["status"] == "pending", body
    is_error, tool = asyncio.run(_one_tool(doors, "event_status", {"event_id": pending_id}))
    assert not is_error and tool["status"] == "pending", tool

    # a record written straight to Kafka (no door) that the worker refuses, carrying an event_id
    bad = wire("user:status", tenant=A, event_id=bad_id, confidence=7)
    [(bad_p, bad_o)] = publish_raw(settings, [(b"acme|user:status", orjson.dumps(bad))])
    erase_me = wire("user:erased", tenant=A, event_id=erased_id)
    asyncio.run(_http(doors.apis[0], erase_me))
    doors.apply()
    with httpx.Client(headers={"X-API-Key": "key-a"}, timeout=30) as http:
        r = http.delete(f"{doors.apis[1]}/v1/subjects/user:erased", params={"tenant": A})
        assert r.status_code == 202, r.text
    doors.apply()

    applied = _status(doors, pending_id).json()
    assert applied["status"] == "applied", applied
    with pg(settings) as conn:
        row = conn.execute(
            'SELECT memory_id, "partition", "offset" FROM events WHERE tenant = %s AND event_id = %s', (A, pending_id)
        ).fetchone()
    assert (applied["memory_id"], applied["partition"], applied["offset"]) == tuple(row), applied
    assert applied["version_id"] and applied["type"] == "memory.asserted", applied
    assert applied["effect"]["effect"] and applied["effect"]["version_id"] == applied["version_id"], applied

    dead = _status(doors, bad_id).json()
    assert dead["status"] == "dead_lettered", dead
    [(_, _, code, field)] = [d for d in _dead_letters(settings) if (d[0], d[1]) == (bad_p, bad_o)]
    assert dead["reason"]["code"] == code and dead["reason"]["field"] == field, (dead, code, field)
    assert (dead["partition"], dead["offset"]) == (bad_p, bad_o), dead

    gone = _status(doors, erased_id).json()
    assert gone["status"] == "duplicate" and gone["erased"] is True, gone
    assert "user:erased" not in str(gone), gone  # nothing of the erased event is kept

    # the MCP tool and the read client (sync and async) answer what the route answers
    ids = (pending_id, bad_id, erased_id, never)

    async def elsewhere() -> list[tuple[Any, ...]]:
        out = []
        async with _session(doors.mcp) as mcp, AsyncLedgerClient(doors.apis[0], api_key="key-a", tenant=A) as client:
            for event_id in ids:
                tool = await _tool(mcp, "event_status", {"event_id": event_id, "tenant": A})
                out.append((tool, (await client.event_status(event_id)).model_dump(mode="json", exclude_none=True)))
        return out

    with LedgerClient(doors.apis[1], api_key="key-a", tenant=A) as client:
        for event_id, (tool, async_client) in zip(ids, asyncio.run(elsewhere()), strict=True):
            route = _status(doors, event_id).json()
            assert tool == (False, route), (tool, route)
            assert async_client == route
            assert client.event_status(event_id).model_dump(mode="json", exclude_none=True) == route

    # tenancy: a key not bound to the tenant is refused; another tenant never sees the id
    r = _status(doors, pending_id, key="key-b")
    assert r.status_code == 403 and r.json()["detail"][0]["code"] == "forbidden_tenant", r.text
    for event_id in (pending_id, bad_id, erased_id):
        other = _status(doors, event_id, tenant=B, key="key-b").json()
        assert other == {"tenant": B, "event_id": event_id, "status": "unknown"}, other
    is_error, tool = asyncio.run(_one_tool(doors, "event_status", {"event_id": pending_id, "tenant": A}, "key-b"))
    assert is_error and tool["status"] == 403, tool


# -- class: an erased id with other content is a conflict --------------------------------------------------------


def test_an_erased_id_with_other_content_is_a_conflict_at_every_door_and_at_the_worker(doors: Doors) -> None:
    settings = doors.settings
    door_id, raw_id = _id(), _id()
    subject = "user:forgotten"
    original = {eid: wire(subject, tenant=A, event_id=eid, value="window") for eid in (door_id, raw_id)}
    asyncio.run(_http(doors.apis[0], original[door_id]))
    with LedgerProducer(settings) as producer:  # a publisher that writes to Kafka itself
        producer.publish(original[raw_id])
    doors.apply()
    with httpx.Client(headers={"X-API-Key": "key-a"}, timeout=30) as http:
        assert http.delete(f"{doors.apis[0]}/v1/subjects/{subject}", params={"tenant": A}).status_code == 202
    doors.apply()

    before = end_offsets(settings)

    async def doors_answer() -> list[dict[str, Any]]:
        changed = {**original[door_id], "value": "aisle", "content": f"{subject} prefers aisle seats"}
        async with _session(doors.mcp) as mcp:
            return [
                await _http(doors.apis[0], original[door_id]),
                await _mcp(mcp, original[door_id]),
                await _http(doors.apis[1], changed),
                await _mcp(mcp, changed),
            ]

    same_http, same_mcp, other_http, other_mcp = asyncio.run(doors_answer())
    for same in (same_http, same_mcp):
        assert same == {"accepted": True, "duplicate": True, "erased": True}, same
    assert (other_http["code"], other_http["field"]) == ("event_id_conflict", "events.0.event_id"), other_http
    assert (other_mcp["code"], other_mcp["field"]) == ("event_id_conflict", "event_id"), other_mcp
    assert end_offsets(settings) == before, "an erased id was published again"

    # straight to Kafka (no door): the same content has no effect, other content is dead-lettered as a conflict
    letters_before = set(_dead_letters(settings))
    with LedgerProducer(settings) as producer:
        same = producer.publish(original[raw_id])
    with LedgerProducer(settings) as producer:
        other = producer.publish({**original[raw_id], "value": "aisle", "content": f"{subject} prefers aisle"})
    doors.apply()
    new = {(p, o): (code, field) for p, o, code, field in set(_dead_letters(settings)) - letters_before}
    assert new == {(other.partition, other.offset): ("event_id_conflict", "event_id")}, (new, same, other)
    status = _status(doors, raw_id).json()
    assert status["status"] == "duplicate" and status["erased"] is True, status
    assert [(d["partition"], d["offset"], d["code"]) for d in status["dead_letters"]] == [
        (other.partition, other.offset, "event_id_conflict")
    ], status
    with pg(settings) as conn:
        rows = conn.execute("SELECT count(*) FROM events WHERE tenant = %s AND subject = %s", (A, subject)).fetchone()
    assert rows[0] == 1, "only the erasure's tombstone is left of the subject"

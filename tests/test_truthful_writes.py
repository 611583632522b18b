"""Every write door says only what is known: an answer never claims an effect that did not happen.

A write is answered when its event is in the ledger, before the projection applies it, so what a door may say is
`accepted` with `effect: "pending"` (or `"applied"` for a retry of an applied event) and where to ask what it did
(`status_url`); a retraction of something the tenant's projection does not hold is refused (404 naming `key` or
`target_version`) rather than published to do nothing. The class, over every write route and tool (POST
/v1/events, DELETE /v1/subjects/{s}, MCP remember and forget of a fact, of one version, of an episode's version,
of a key and a version that do not exist): after the projection settles, each answer's claims are compared with
the audit replay's effect of its event; a refusal left no event.

And an episode can be retracted by its version (MCP forget, or a memory.retracted with `target_version` through
POST /v1/events): the audit says `ended`, its search document follows (recall no longer finds it), the subject's
facts no longer list it; the other episodes stay.

The whole ledger on private names (worker, indexer, embedder: tests.support.pipeline), the HTTP API in process and
the MCP server as a child over Streamable HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from producers.contract import EventType, MemoryEvent, Source, SourceType, rfc3339
from projections.versions import additions, effects, fold
from tests.conftest import unique
from tests.support import asserted, at, marked, pipeline
from tests.support.servers import McpHttpServer, tool_body

TENANT, KEY = "tw", "k-tw"
LISBON = "We talked about the trip to Lisbon and the tram up to the castle."
PORTO = "We talked about the trip to Porto and the port wine cellars by the river."
HIKE = "We planned a hike in the Sintra hills for next spring."


def _episode(content: str, day: float) -> MemoryEvent:
    return asserted(
        "user:7",
        None,
        None,
        day,
        tenant=TENANT,
        kind="episodic",
        content=content,
        source=Source(type=SourceType.IMPORTED, service="chat"),
    )


SEED = [
    asserted("user:7", "pref.seat", "window", 0, tenant=TENANT, content="user 7 prefers the window seat"),
    asserted("user:7", "pref.meal", "vegetarian", 0, tenant=TENANT, content="user 7 eats vegetarian meals"),
    _episode(LISBON, 1),
    _episode(PORTO, 2),
    _episode(HIKE, 3),
    asserted("user:9", "pref.seat", "aisle", 0, tenant=TENANT, content="user 9 prefers the aisle seat"),
]
SEAT, MEAL, LISBON_EP, PORTO_EP, HIKE_EP, USER9 = SEED
LATER = datetime(9999, 12, 31, tzinfo=UTC)  # what holds only from then: a fact, an episode
FUTURE_FACT = MemoryEvent(
    type=EventType.ASSERTED, tenant=TENANT, subject="user:10", key="plan.city", value="Oslo",
    content="user 10 moves to Oslo", valid_from=LATER, observed_at=at(0),
)  # fmt: skip
FUTURE_EPISODE = MemoryEvent(
    type=EventType.ASSERTED, tenant=TENANT, subject="user:10", kind="episodic", content="the farewell party",
    valid_from=LATER, observed_at=at(0), source=Source(type=SourceType.IMPORTED, service="chat"),
)  # fmt: skip
PAST_THEN_LATER = [  # a fact that held, was retracted, and holds again only from LATER: nothing of it holds now
    asserted("user:10", "plan.job", "baker", 0, tenant=TENANT),
    marked(EventType.RETRACTED, "user:10", "plan.job", 1, tenant=TENANT),
    MemoryEvent(
        type=EventType.ASSERTED, tenant=TENANT, subject="user:10", key="plan.job", value="pilot",
        content="user 10 will fly", valid_from=LATER, observed_at=at(2),
    ),
]  # fmt: skip
SEED += [FUTURE_FACT, FUTURE_EPISODE, *PAST_THEN_LATER]


@pytest.fixture(scope="module")
def stack(base_settings) -> Iterator[dict[str, Any]]:
    settings = base_settings.private(unique("tw"), api_keys={KEY: [TENANT]})
    with pipeline(settings, seed=SEED, app=True) as pipe, McpHttpServer(settings) as mcp:
        yield {"pipe": pipe, "mcp": mcp.url}


def _mcp(url: str, tool: str, arguments: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(the status the route would answer, the tool's structured result) of one MCP call."""

    async def call() -> tuple[int, dict[str, Any]]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as http:
            async with Client(streamable_http_client(url, http_client=http)) as c:
                r = await c.call_tool(tool, arguments)
        body = tool_body(r)
        return (body.get("status", 500) if r.is_error else 200), body

    return asyncio.run(call())


def _http(stack: dict[str, Any], method: str, path: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    r = stack["pipe"].client.request(method, path, headers={"X-API-Key": KEY}, **kw)
    return r.status_code, r.json()


def _publish(stack: dict[str, Any], event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, body = _http(stack, "POST", "/v1/events", json={"events": [event]})
    return status, (body["results"][0] if "results" in body else body)


# every write door, each with the event id it writes and the subject whose audit replay tells what it did
WRITES: dict[str, Any] = {
    "POST-events-assert": lambda s: _publish(
        s,
        {
            "type": "memory.asserted",
            "tenant": TENANT,
            "subject": "user:8",
            "key": "pref.tea",
            "value": "green",
            "content": "user 8 drinks green tea",
            "event_id": "w-assert",
        },  # fmt: skip
    ),
    "POST-events-retract-episode": lambda s: _publish(
        s,
        {
            "type": "memory.retracted",
            "tenant": TENANT,
            "subject": "user:7",
            "target_version": PORTO_EP.version_id,
            "event_id": "w-retract-porto",
        },  # fmt: skip
    ),
    "DELETE-subject": lambda s: _http(s, "DELETE", "/v1/subjects/user:9", params={"tenant": TENANT}),
    "mcp-remember": lambda s: _mcp(
        s["mcp"],
        "remember",
        {
            "tenant": TENANT,
            "event_id": "w-remember",
            "subject": "user:8",
            "key": "pref.coffee",
            "value": "black",
            "content": "user 8 drinks black coffee",
        },  # fmt: skip
    ),
    "mcp-forget-fact": lambda s: _mcp(
        s["mcp"], "forget", {"tenant": TENANT, "subject": "user:7", "key": "pref.seat", "event_id": "w-forget-seat"}
    ),
    "mcp-forget-version": lambda s: _mcp(
        s["mcp"],
        "forget",
        {
            "tenant": TENANT,
            "subject": "user:7",
            "key": "pref.meal",
            "target_version": MEAL.version_id,
            "event_id": "w-forget-meal",
        },  # fmt: skip
    ),
    "mcp-forget-episode": lambda s: _mcp(
        s["mcp"],
        "forget",
        {
            "tenant": TENANT,
            "subject": "user:7",
            "target_version": LISBON_EP.version_id,
            "event_id": "w-forget-lisbon",
        },  # fmt: skip
    ),
    "mcp-forget-no-such-key": lambda s: _mcp(
        s["mcp"], "forget", {"tenant": TENANT, "subject": "user:7", "key": "pref.none", "event_id": "w-forget-none"}
    ),
    "mcp-forget-no-such-version": lambda s: _mcp(
        s["mcp"],
        "forget",
        {"tenant": TENANT, "subject": "user:7", "target_version": "0" * 32, "event_id": "w-forget-nover"},  # fmt: skip
    ),
}
SUBJECT = {"POST-events-assert": "user:8", "mcp-remember": "user:8", "DELETE-subject": "user:9"}


@pytest.fixture(scope="module")
def answered(stack: dict[str, Any]) -> dict[str, tuple[int, dict[str, Any]]]:
    """Every write done once, then the projection settled."""
    out = {name: write(stack) for name, write in WRITES.items()}
    stack["pipe"].settle()
    return out


def _audit(stack: dict[str, Any], subject: str) -> dict[str, dict[str, Any]]:
    status, body = _http(stack, "GET", f"/v1/subjects/{subject}/events", params={"tenant": TENANT})
    assert status == 200, body
    return {e["event_id"]: e for e in body["events"]}


def _claimed(body: dict[str, Any]) -> str | None:
    """The effect an answer claims happened (None: only that its event is in the ledger)."""
    action = body.get("action")
    if action in ("retracted", "erased"):  # the answer the tool used to give, as if it had been applied
        return {"retracted": "ended", "erased": "erased"}[action]
    return None if body.get("effect") in ("pending", None) else body["effect"]


@pytest.mark.parametrize("door", list(WRITES))
def test_an_answer_claims_no_effect_that_did_not_happen(stack, answered, door) -> None:
    status, body = answered[door]
    audit = _audit(stack, SUBJECT.get(door, "user:7"))
    if status >= 400:  # refused: nothing was written
        assert status == 404 and body["detail"][0]["code"] == "not_found", body
        assert body["detail"][0]["field"] in ("key", "target_version"), body
        assert not any(eid.startswith("w-forget-no") for eid in audit), audit.keys()
        return
    assert status in (200, 202), body
    event_id = body["event_id"]
    assert event_id in audit, f"{door}: accepted, but its event is not in the audit replay"
    effect = audit[event_id]["effect"]["effect"]
    claimed = _claimed(body)
    if claimed == "applied":
        assert effect != "no_effect", (door, body, audit[event_id])
    elif claimed is not None:
        assert claimed == effect, f"{door} answered {claimed!r}, the audit replay says {audit[event_id]['effect']}"
    # a write says what it knows when it answers: in the ledger, its effect pending, and where to ask
    assert body.get("effect") in ("pending", "applied"), body
    assert body.get("status_url") == f"/v1/events/{event_id}?tenant={TENANT}", body
    status, fate = _http(stack, "GET", body["status_url"])
    assert status == 200 and fate["status"] == "applied" and fate["effect"] == audit[event_id]["effect"], fate


@pytest.mark.parametrize("door", ["mcp-forget-no-such-key", "mcp-forget-no-such-version"])
def test_forgetting_what_does_not_exist_is_refused_naming_it(answered, door) -> None:
    status, body = answered[door]
    assert status == 404, body
    field = "key" if door.endswith("key") else "target_version"
    assert body["detail"][0] == {**body["detail"][0], "code": "not_found", "field": field}


@pytest.mark.parametrize(
    "target",
    [{"key": "plan.city"}, {"key": "plan.job"}, {"target_version": FUTURE_EPISODE.version_id}],
    ids=["a fact from later", "a fact retracted and from later", "an episode from later"],
)
def test_forgetting_what_holds_only_later_is_refused_not_published_to_end_nothing(stack, target) -> None:
    """A retraction ends what holds at its time: `forget` of a fact or an episode that holds only from a later time
    was published to end nothing (`no_effect`), and the memory held once its time came. Refused, naming it."""
    status, body = _mcp(stack["mcp"], "forget", {"tenant": TENANT, "subject": "user:10", **target})
    assert status == 422 and body["detail"][0]["field"] == next(iter(target)), body
    assert "holds from 9999-12-31T00:00:00.000000Z" in body["detail"][0]["message"], body


def test_an_episode_is_retracted_by_its_version(stack, answered) -> None:
    audit = _audit(stack, "user:7")
    for eid, episode in (("w-forget-lisbon", LISBON_EP), ("w-retract-porto", PORTO_EP)):
        assert audit[eid]["effect"] == {**audit[eid]["effect"], "effect": "ended", "version_id": episode.version_id}
        assert audit[episode.event_id]["effect"]["effect"] == "retracted"
        assert audit[eid]["memory_id"] == episode.memory_id  # filed under the episode's own chain
    status, facts = _http(stack, "GET", "/v1/subjects/user:7/facts", params={"tenant": TENANT})
    assert status == 200
    shown = {f["memory_id"] for f in facts["facts"]}
    assert HIKE_EP.memory_id in shown and not shown & {LISBON_EP.memory_id, PORTO_EP.memory_id}
    for query, gone in (
        ("the trip to Lisbon and the tram up to the castle", LISBON_EP),
        ("the trip to Porto and the port wine cellars", PORTO_EP),
    ):
        found = {}
        for as_of in (rfc3339(at(5)), None):  # before the retraction the question finds it; since, not
            body = {"tenant": TENANT, "query": query, "top_k": 10, **({"as_of": as_of} if as_of else {})}
            status, res = _http(stack, "POST", "/v1/recall", json=body)
            assert status == 200, res
            found[as_of] = {h["memory_id"] for h in res["hits"]}
        assert gone.memory_id in found[rfc3339(at(5))] and gone.memory_id not in found[None], found
    status, res = _http(stack, "POST", "/v1/recall", json={"tenant": TENANT, "query": HIKE, "top_k": 10})
    assert HIKE_EP.memory_id in {h["memory_id"] for h in res["hits"]}


def test_a_retraction_names_a_version_of_its_own_fact(stack) -> None:
    """target_version with another fact's key is refused naming key; with an episode's version, key is left out."""
    status, body = _mcp(
        stack["mcp"],
        "forget",
        {"tenant": TENANT, "subject": "user:7", "key": "pref.seat", "target_version": HIKE_EP.version_id},
    )
    assert status == 422 and body["detail"][0]["field"] == "key", body
    e = MemoryEvent(type=EventType.RETRACTED, tenant=TENANT, subject="user:7", target_version=HIKE_EP.version_id)
    assert e.key is None  # the contract takes a retraction of a version without a key


@pytest.mark.unit
def test_a_resolved_retraction_is_filed_under_its_episode_and_ends_it() -> None:
    """The pure core: `additions` files a retraction the recorder resolved under the episode's chain (and leaves
    an unresolved one under its own (subject, key, scope), where it ends nothing)."""
    e = MemoryEvent(type=EventType.RETRACTED, tenant=TENANT, subject="user:7", target_version=HIKE_EP.version_id,
                    valid_from=at(10), observed_at=at(10))  # fmt: skip
    resolved = additions([(HIKE_EP, 0, 0), (e, 0, 1)], {(TENANT, e.event_id): HIKE_EP.memory_id})
    assert resolved.facts == [HIKE_EP.memory_id]
    [ended] = fold(resolved.versions[HIKE_EP.memory_id], resolved.marks[HIKE_EP.memory_id])
    assert (ended.status, ended.valid_to) == ("retracted", at(10))
    alone = additions([(HIKE_EP, 0, 0), (e, 0, 1)])
    assert sorted(alone.facts) == sorted([HIKE_EP.memory_id, e.memory_id])
    assert effects([], alone.marks[e.memory_id])[e.event_id]["effect"] == "no_effect"


def test_a_forget_retried_after_its_subject_was_erased_is_answered_as_its_retry(stack) -> None:
    """The same forget again (its event_id), once the subject is erased: the first call's retry, as the door answers
    one (duplicate, effect erased), not 404 as if never asked; a new forget of it is refused, and the id with other
    content is a conflict."""
    pipe, subject = stack["pipe"], "user:rf"
    fact = asserted(subject, "pref.seat", "window", 0, tenant=TENANT, content="rf prefers the window seat")
    meal = asserted(subject, "pref.meal", "fish", 0, tenant=TENANT, content="rf eats fish", scope="lunch")
    episode = asserted(
        subject, None, None, 1, tenant=TENANT, kind="episodic", content="We took the ferry to the island.",
        scope="trip", source=Source(type=SourceType.IMPORTED, service="chat"),
    )  # fmt: skip
    pipe.publish([fact, meal, episode])
    pipe.settle()
    by_key = {"tenant": TENANT, "subject": subject, "key": "pref.seat", "event_id": "rf-forget-key"}
    by_version = {"tenant": TENANT, "subject": subject, "target_version": episode.version_id, "event_id": "rf-ep"}
    # a fact's version named alone (no key, no scope): the worker finds its fact from the version
    by_fact_version = {"tenant": TENANT, "subject": subject, "target_version": meal.version_id, "event_id": "rf-v"}
    for args in (by_key, by_version, by_fact_version):
        status, body = _mcp(stack["mcp"], "forget", args)
        assert status == 200 and body["effect"] == "pending", body
    pipe.settle()
    audit = _audit(stack, subject)
    assert audit[meal.event_id]["effect"]["effect"] == "retracted", audit[meal.event_id]
    assert audit[episode.event_id]["effect"]["effect"] == "retracted", audit[episode.event_id]
    status, body = _mcp(stack["mcp"], "forget", {"tenant": TENANT, "subject": subject, "erase_subject": True})
    assert status == 200, body
    pipe.settle()
    for args in (by_key, by_version, by_fact_version):
        status, body = _mcp(stack["mcp"], "forget", args)
        assert status == 200 and body["duplicate"] is True and body["effect"] == "erased", (args, body)
        assert body["event_id"] == args["event_id"], body
    status, body = _mcp(stack["mcp"], "forget", {**by_key, "event_id": "rf-forget-new"})  # never asked: nothing there
    assert status == 404 and body["detail"][0]["field"] == "key", body
    status, body = _mcp(stack["mcp"], "forget", {**by_key, "key": "pref.meal"})  # the first id, other content
    assert status == 422 and body["detail"][0]["code"] == "event_id_conflict", body
    status, body = _mcp(stack["mcp"], "forget", {**by_key, "subject": "user:never", "event_id": "rf-other"})
    assert status == 404, body  # an id no door took: the 404 stands

"""POST /v1/events through the real app (lifespan included) against the real broker."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.routes import events as events_route
from producers.contract import decode
from producers.settings import Settings
from producers.topics import ensure_topics
from tests.conftest import unique
from tests.support import drop_topics, pipeline, read_topic, wait_for, wire

ACME = {"X-API-Key": "key-acme"}


def _event(subject: str = "user:1", **over: Any) -> dict[str, Any]:
    return wire(subject, **{"tenant": "acme", "key": "preference.seat", **over})


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": {"key-acme": ["acme"], "key-globex": ["globex"]}})


@pytest.fixture
def client(api_settings: Settings):
    ensure_topics(api_settings)
    try:
        with TestClient(create_app(api_settings)) as c:
            yield c
    finally:
        drop_topics(api_settings)


def _on_topic(settings: Settings) -> dict[str, tuple[int, int]]:
    return {decode(r.value).event_id: (r.partition, r.offset) for r in read_topic(settings)}


def test_all_valid_events_are_published_and_located(client: TestClient, api_settings: Settings) -> None:
    body = [_event("user:1", event_id="given-1"), _event("user:2"), _event("user:1", value="aisle", content="aisle")]
    resp = client.post("/v1/events", json={"events": body}, headers=ACME)
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["accepted"] for r in results] == [True, True, True]
    assert results[0]["event_id"] == "given-1"
    assert len({r["event_id"] for r in results}) == 3  # generated ids for the others
    assert results[0]["memory_id"] == results[2]["memory_id"] != results[1]["memory_id"]
    on_topic = _on_topic(api_settings)
    assert on_topic == {r["event_id"]: (r["partition"], r["offset"]) for r in results}
    assert results[0]["partition"] == results[2]["partition"] and results[0]["offset"] < results[2]["offset"]


def test_a_mixed_batch_publishes_exactly_the_valid_events(client: TestClient, api_settings: Settings) -> None:
    body = [
        _event("user:1"),
        _event("user:2", content=..., event_id="no-content"),
        _event("user:3"),
        "not an event",
        _event("user:4", tenant=7),
        _event("user:5", observed_at="2026-01-02T03:04:05"),  # naive time
        _event("user:6", source={"type": "explicit"}, confidence=0.4),
        _event("user:7", kind="episodic", key=...),
    ]
    resp = client.post("/v1/events", json={"events": body}, headers=ACME)
    assert resp.status_code == 207, resp.text
    results = resp.json()["results"]
    assert len(results) == len(body)
    assert [r["accepted"] for r in results] == [True, False, True, False, False, False, False, True]
    errors = {i: r["error"] for i, r in enumerate(results) if not r["accepted"]}
    assert {i: (e["code"], e["field"]) for i, e in errors.items()} == {
        1: ("missing_field", "events.1.content"),
        3: ("not_an_object", "events.3"),
        4: ("wrong_type", "events.4.tenant"),
        5: ("invalid_time", "events.5.observed_at"),
        6: ("invalid_value", "events.6.confidence"),
    }
    assert all(e["message"] for e in errors.values())
    assert results[1]["event_id"] == "no-content" and results[3]["event_id"] is None
    accepted = {r["event_id"]: (r["partition"], r["offset"]) for r in results if r["accepted"]}
    assert _on_topic(api_settings) == accepted  # exactly the accepted ones, where the response says


def test_no_valid_event_is_422_with_per_event_results(client: TestClient, api_settings: Settings) -> None:
    resp = client.post("/v1/events", json={"events": [{"type": "memory.asserted"}, {}]}, headers=ACME)
    assert resp.status_code == 422
    results = resp.json()["results"]
    assert [r["accepted"] for r in results] == [False, False]
    assert results[0]["error"]["field"].startswith("events.0.")
    assert resp.json()["detail"] == [r["error"] for r in results]  # the one error shape, beside the results
    assert read_topic(api_settings) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "events"),
        ({"events": []}, "events"),
        ({"events": "x"}, "events"),
        ({"events": [{}] * (events_route.MAX_EVENTS_PER_CALL + 1)}, "events"),
        ({"events": [{}], "tenant": "acme"}, "tenant"),
    ],
)
def test_a_bad_body_is_422_naming_the_field(client: TestClient, body: dict, field: str) -> None:
    resp = client.post("/v1/events", json=body, headers=ACME)
    assert resp.status_code == 422, resp.text
    assert [d["field"] for d in resp.json()["detail"]] == [field]


def test_a_body_that_is_not_json_is_422_naming_its_position(client: TestClient) -> None:
    resp = client.post("/v1/events", content=b"{not json", headers={**ACME, "Content-Type": "application/json"})
    assert resp.status_code == 422
    [detail] = resp.json()["detail"]
    assert (detail["code"], detail["field"]) == ("bad_json", "body")
    assert "line 1, column 2 (char 1)" in detail["message"]


def test_the_largest_allowed_batch_is_accepted(client: TestClient, api_settings: Settings) -> None:
    body = [_event(f"user:{i % 50}", value=i) for i in range(events_route.MAX_EVENTS_PER_CALL)]
    resp = client.post("/v1/events", json={"events": body}, headers=ACME)
    assert resp.status_code == 200
    assert len(read_topic(api_settings)) == events_route.MAX_EVENTS_PER_CALL


def test_without_a_known_key_it_is_401(client: TestClient, api_settings: Settings) -> None:
    assert client.post("/v1/events", json={"events": [_event()]}).status_code == 401
    assert client.post("/v1/events", json={"events": [_event()]}, headers={"X-API-Key": "nope"}).status_code == 401
    bearer = {"Authorization": "Bearer key-acme"}
    assert client.post("/v1/events", json={"events": [_event()]}, headers=bearer).status_code == 200
    assert len(read_topic(api_settings)) == 1


def test_another_tenant_is_403_naming_the_event_and_nothing_is_published(
    client: TestClient, api_settings: Settings
) -> None:
    body = [_event("user:1"), _event("user:2"), _event("user:3", tenant="globex")]
    resp = client.post("/v1/events", json={"events": body}, headers=ACME)
    assert resp.status_code == 403
    assert resp.json()["detail"] == [
        {"code": "forbidden_tenant", "field": "events.2.tenant", "message": "this API key may not use tenant 'globex'"}
    ]
    assert read_topic(api_settings) == []
    ok = client.post("/v1/events", json={"events": [_event(tenant="globex")]}, headers={"X-API-Key": "key-globex"})
    assert ok.status_code == 200


def test_a_down_broker_is_503_and_names_every_event(api_settings: Settings) -> None:
    nowhere = api_settings.model_copy(update={"kafka_bootstrap": "127.0.0.1:1", "api_kafka_timeout_s": 2.0})
    with TestClient(create_app(nowhere)) as c:
        resp = c.post("/v1/events", json={"events": [_event(event_id="e-1"), _event("user:2")]}, headers=ACME)
    assert resp.status_code == 503
    results = resp.json()["results"]
    assert [r["accepted"] for r in results] == [False, False]
    assert results[0]["event_id"] == "e-1" and results[1]["event_id"]
    assert results[0]["error"]["code"] == "publish_unavailable"
    assert results[1]["error"]["field"] == "events.1"
    [detail] = resp.json()["detail"]
    assert detail["code"] == "store_unavailable" and detail["message"].startswith("kafka: ")


def test_an_event_whose_publish_never_reached_the_ledger_says_unpublished_and_a_retry_applies_it(
    base_settings: Settings,
) -> None:
    """The door claims an id before it publishes; when the broker does not answer, the record may or may not have
    been written, so the claim stays and the event reads `pending` while a delivery could still land. Once none
    can (the producer's delivery bound has passed) and the worker has read the whole log without meeting it, it
    reads `unpublished`: the same event sent again is published, and applied."""
    private = base_settings.private(unique("unpub"), api_keys={"key-acme": ["acme"]})
    short = private.model_copy(update={"api_kafka_timeout_s": 1.0, "producer_timeout_s": 1.0})
    event = _event(event_id="e-lost")
    with pipeline(short, seed=[_event("user:seed", event_id="e-seed")], indexer=False) as pipe:  # tables made
        with TestClient(create_app(short.model_copy(update={"kafka_bootstrap": "127.0.0.1:1"}))) as c:
            assert c.post("/v1/events", json={"events": [event]}, headers=ACME).status_code == 503
        with TestClient(create_app(private)) as c:  # its bound (30 s) has not passed: a delivery could still land
            r = c.get("/v1/events/e-lost", params={"tenant": "acme"}, headers=ACME)
            assert r.json()["status"] == "pending", r.text
        with TestClient(create_app(short)) as c:

            def status() -> str:
                r = c.get("/v1/events/e-lost", params={"tenant": "acme"}, headers=ACME)
                assert r.status_code == 200, r.text
                return r.json()["status"]

            wait_for(lambda: status() == "unpublished", 30, what="the lost event read as unpublished")
            retry = c.post("/v1/events", json={"events": [event]}, headers=ACME)
            assert retry.status_code == 200 and retry.json()["results"][0]["accepted"], retry.text
            assert status() == "pending"  # the retry's claim is dated anew: its delivery could still land
            pipe.caught_up()
            assert status() == "applied"

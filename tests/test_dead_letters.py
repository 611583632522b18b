"""The dead-letter workflow end to end, on the real servers: list, open, re-drive, discard, over HTTP and MCP.

One private ledger with encryption on, the real projector (`python -m stream_processors`), the API in process and
`ledger mcp --transport http` as its own process. Records the worker refuses are written the ways they reach it:
a malformed record and an undecodable one straight to Kafka (as a producer in another language would), and a
content conflict under an applied id through the SDK (sealed). Proved:

- the tenant's letters are listed with their reason, field and ledger position; another tenant sees none of them,
  a record naming no tenant is listed to nobody, and a letter is opened with its record's fields (a sealed one's
  personal fields too, the API holding the KEK);
- a re-drive is the corrected event through the door, linked to the letter: applied, the letter `redriven` by it,
  the audit replay shows the link; a second action on a resolved letter is 409 `dead_letter_resolved`;
- a discard (here over MCP, by an operator key; an agent's key is refused) is an event with its reason, and the
  letter reads `discarded`; nothing is deleted (the letters stay in the table, the events in the log);
- replaying the log into a fresh schema, partitions in reverse order and every record twice, gives the same letters
  in the same states (a redelivery or a rebuild changes nothing);
- the worker's `ledger_worker_dead_letters_by_state` counts the letters open, redriven and discarded.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from api.main import create_app
from producers.contract import InvalidEvent, from_dict
from producers.keys.store import key_context
from producers.records import decode_record
from producers.sdk import LedgerProducer
from producers.settings import Settings
from projections.postgres.counts import dead_letters_name
from projections.postgres.recorder import Recorder, connect
from projections.postgres.schema import create_schema, drop_schema
from tests.conftest import unique
from tests.support import MALFORMED_CURSORS, Worker, pg, publish_raw, read_topic, wait_caught_up, wait_for, wire
from tests.support.processes import frozen
from tests.support.servers import McpHttpServer, call_tool, free_port
from tests.support.stores import private_ledger

A, B = "dl-acme", "dl-globex"
KEYS = {"key-a": [A], "key-agent": [A], "key-b": [B]}
ADMIN = "key-a"


@dataclass
class World:
    settings: Settings
    http: TestClient
    mcp: str
    worker: Worker
    malformed: tuple[int, int]  # A's record without content
    conflict: tuple[int, int]  # A's sealed record re-using an applied id with other content
    other: tuple[int, int]  # B's malformed record
    nameless: tuple[int, int]  # bytes that are not JSON: no tenant

    def get(self, path: str, key: str = "key-a", **params: Any) -> Any:
        r = self.http.get(path, params=params, headers={"X-API-Key": key})
        assert r.status_code == 200, r.text
        return r.json()

    def letters(self, tenant: str = A, key: str = "key-a", **params: Any) -> dict[tuple[int, int], dict[str, Any]]:
        body = self.get("/v1/dead-letters", key, tenant=tenant, **params)
        return {(d["partition"], d["offset"]): d for d in body["dead_letters"]}

    def caught_up(self) -> None:
        wait_caught_up(self.settings, timeout=90, worker=self.worker)


@pytest.fixture(scope="module")
def world(base_settings: Settings) -> Iterator[World]:
    kek = SecretStr(base64.b64encode(os.urandom(32)).decode())
    settings = base_settings.private(
        unique("dlq"), api_keys=KEYS, mcp_admin_keys=[ADMIN], encryption="on", kek=kek, metrics_refresh_s=0.5
    )
    settings = settings.model_copy(update={"worker_metrics_port": free_port()})  # the worker's gauge is read too
    with private_ledger(settings), Worker(settings) as worker, McpHttpServer(settings) as mcp:
        with TestClient(create_app(settings)) as http:
            first = wire("user:1", tenant=A, event_id="ev-orig", value="window")
            r = http.post("/v1/events", json={"events": [first]}, headers={"X-API-Key": "key-a"})
            assert r.status_code == 200, r.text
            broken = wire("user:2", tenant=A, event_id="ev-bad", value="aisle", content=...)
            b_broken = wire("user:9", tenant=B, event_id="ev-b", content=...)
            [malformed, other, nameless] = publish_raw(
                settings,
                [
                    (b"dl-acme|user:2", orjson.dumps(broken)),
                    (b"dl-globex|user:9", orjson.dumps(b_broken)),
                    (None, b"\xffnot json at all"),
                ],
            )
            wait_for(lambda: _applied(settings, A, "ev-orig"), 90, what="the first event applied")
            with LedgerProducer(settings) as producer:  # the SDK seals; no door claims the id: the worker refuses
                [done] = producer.publish_many([wire("user:1", tenant=A, event_id="ev-orig", value="middle")])
            conflict = (done.partition, done.offset)
            wait_caught_up(settings, timeout=90, worker=worker)
            yield World(settings, http, mcp.url, worker, malformed, conflict, other, nameless)


def _applied(settings: Settings, tenant: str, event_id: str) -> bool:
    with pg(settings) as conn:
        row = conn.execute("SELECT 1 FROM events WHERE tenant = %s AND event_id = %s", (tenant, event_id)).fetchone()
    return row is not None


def _states(settings: Settings, schema: str) -> list[tuple[Any, ...]]:
    """Every letter with its resolution and whether it kept its bytes, as stored (the listing's source), in position
    order."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return conn.execute(
            f'SELECT d."partition", d."offset", d.tenant, d.code, d.field, r.state, r.event_id, '
            f'r.by_partition, r.by_offset, r.reason, d.raw IS NULL FROM "{schema}".dead_letters d '
            f'LEFT JOIN "{schema}".dead_letter_resolutions r '
            'ON r.topic = d.topic AND r."partition" = d."partition" AND r."offset" = d."offset" '
            "AND r.tenant = d.tenant "
            "ORDER BY 1, 2"
        ).fetchall()


def tool(world: World, name: str, key: str = ADMIN, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    return call_tool(world.mcp, key, name, arguments)


# -- the contract's field and type (pure) --------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"type": "deadletter.discarded", "dead_letter": {"partition": 0, "offset": 1}}, None),  # no reason
        ({"type": "deadletter.discarded", "reason": "r"}, None),  # no dead letter named
        ({"type": "subject.erased", "dead_letter": {"partition": 0, "offset": 1}}, "dead_letter"),  # corrects nothing
        ({"dead_letter": {"partition": -1, "offset": 1}}, "dead_letter.partition"),
        ({"dead_letter": {"partition": 0, "offset": 2**63}}, "dead_letter.offset"),
        ({"dead_letter": {"partition": 0, "offset": 1, "why": "x"}}, "dead_letter.why"),
        # a letter's resolution id on any other event: it would leave that letter unresolvable for good
        ({"event_id": "deadletter:0:1"}, "event_id"),
        ({"event_id": "deadletter:0:1", "dead_letter": {"partition": 0, "offset": 2}}, "event_id"),
        ({"event_id": "deadletter:anything"}, "event_id"),
    ],
)
def test_the_contract_refuses_a_dead_letter_link_that_is_not_one(over: dict[str, Any], field: str | None) -> None:
    with pytest.raises(InvalidEvent) as refused:
        from_dict(wire("user:1", tenant=A) | over)
    assert refused.value.field == field, refused.value


@pytest.mark.unit
def test_a_link_is_part_of_what_the_event_says() -> None:
    """A re-drive and the same event without the link are two contents (a retry of one never passes for the other);
    an event without the link keeps the fingerprint it always had (the field is left out of the wire when unset)."""
    plain = from_dict(wire("user:1", tenant=A, event_id="e"))
    linked = from_dict(wire("user:1", tenant=A, event_id="e", dead_letter={"partition": 2, "offset": 5}))
    assert "dead_letter" not in plain.to_wire() and linked.to_wire()["dead_letter"] == {"partition": 2, "offset": 5}
    assert plain.fingerprint != linked.fingerprint
    own = from_dict(wire("user:1", tenant=A, event_id="deadletter:2:5", dead_letter={"partition": 2, "offset": 5}))
    assert own.event_id == "deadletter:2:5"  # the resolution of the letter its id names


# -- the whole workflow, in order (each step builds on the one before) ---------------------------------------------


def test_listed_with_reason_field_and_position_to_its_tenant_only(world: World) -> None:
    letters = world.letters(state="open")
    assert set(letters) == {world.malformed, world.conflict}, letters
    bad, clash = letters[world.malformed], letters[world.conflict]
    assert bad["reason"]["code"] == "missing_field" and bad["reason"]["field"] == "content", bad
    assert bad["event_id"] == "ev-bad" and bad["state"] == "open" and "resolution" not in bad, bad
    assert clash["reason"]["code"] == "event_id_conflict" and clash["reason"]["field"] == "event_id", clash
    # B sees its own letter and nothing of A's; the record naming no tenant is nobody's
    assert set(world.letters(B, "key-b")) == {world.other}
    assert world.nameless not in world.letters() and world.nameless not in world.letters(B, "key-b")
    r = world.http.get("/v1/dead-letters", params={"tenant": A}, headers={"X-API-Key": "key-b"})
    assert r.status_code == 403 and r.json()["detail"][0]["code"] == "forbidden_tenant", r.text
    # paging: one at a time, in position order, the cursor from `next`
    page = world.get("/v1/dead-letters", tenant=A, limit=1)
    rest = world.get("/v1/dead-letters", tenant=A, limit=1, after=page["next"])
    assert [*page["dead_letters"], *rest["dead_letters"]] == sorted(
        letters.values(), key=lambda d: (d["partition"], d["offset"])
    )
    assert len(letters) == 2 and rest["next"] is None, rest  # a full last page: nothing follows, no `next`
    assert world.get("/v1/dead-letters", tenant=A, limit=2)["next"] is None
    for cursor in MALFORMED_CURSORS:  # what names no place in the log: refused as the audit replay refuses it
        r = world.http.get("/v1/dead-letters", params={"tenant": A, "after": cursor}, headers={"X-API-Key": "key-a"})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "after", (cursor, r.text)


def test_opened_with_the_records_fields_sealed_ones_opened_here(world: World) -> None:
    p, o = world.malformed
    one = world.get(f"/v1/dead-letters/{p}/{o}", tenant=A)
    assert one["record"]["subject"] == "user:2" and one["record"]["value"] == "aisle" and "sealed" not in one, one
    p, o = world.conflict
    sealed = world.get(f"/v1/dead-letters/{p}/{o}", tenant=A)
    assert sealed["sealed"]["opened"] is True, sealed
    assert sealed["record"]["value"] == "middle", sealed  # a personal field, out of the ciphertext
    # another tenant's letter, asked for under A, does not exist for A; an undecodable one neither
    for p, o in (world.other, world.nameless):
        r = world.http.get(f"/v1/dead-letters/{p}/{o}", params={"tenant": A}, headers={"X-API-Key": "key-a"})
        assert r.status_code == 404 and r.json()["detail"][0]["code"] == "not_found", r.text
    ok, body = tool(world, "dead_letter", tenant=A, partition=world.malformed[0], offset=world.malformed[1])
    assert not ok and body == one, body


def test_redriven_corrected_event_is_applied_and_linked_in_the_audit_replay(world: World) -> None:
    p, o = world.malformed
    corrected = wire("user:2", tenant=A, event_id="ev-bad", value="aisle", content="user 2 prefers aisle seats")
    with frozen(world.worker):  # the re-drive is in the ledger, not applied: its id's status says pending
        r = world.http.post(
            "/v1/dead-letters/redrive",
            json={"tenant": A, "partition": p, "offset": o, "event": corrected},
            headers={"X-API-Key": "key-a"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["effect"] == "pending" and r.json()["dead_letter"] == {"partition": p, "offset": o}, r.text
        pending = world.get("/v1/events/ev-bad", tenant=A)
        assert pending["status"] == "pending", pending  # not the old refusal of the same id
        assert [(d["partition"], d["offset"]) for d in pending["dead_letters"]] == [(p, o)], pending
    world.caught_up()
    status = world.get("/v1/events/ev-bad", tenant=A)
    assert status["status"] == "applied", status
    letter = world.letters()[(p, o)]
    assert letter["state"] == "redriven", letter
    assert letter["resolution"]["event_id"] == "ev-bad"
    assert (letter["resolution"]["partition"], letter["resolution"]["offset"]) == (
        status["partition"],
        status["offset"],
    )
    replay = world.get("/v1/subjects/user:2/events", tenant=A)["events"]
    [event] = [e for e in replay if e["event_id"] == "ev-bad"]
    assert event["event"]["dead_letter"] == {"partition": p, "offset": o}, event
    facts = world.get("/v1/subjects/user:2/facts", tenant=A)["facts"]
    assert [f["value"] for f in facts] == ["aisle"], facts
    # resolved: a second re-drive (or a discard) is refused, naming the event that resolved it
    again = world.http.post(
        "/v1/dead-letters/discard",
        json={"tenant": A, "partition": p, "offset": o, "reason": "late"},
        headers={"X-API-Key": "key-a"},
    )
    assert again.status_code == 409 and again.json()["detail"][0]["code"] == "dead_letter_resolved", again.text
    assert "ev-bad" in again.json()["detail"][0]["message"]


def test_discarded_over_mcp_by_an_operator_with_its_reason(world: World) -> None:
    p, o = world.conflict
    refused, body = tool(world, "discard_dead_letter", key="key-agent", tenant=A, partition=p, offset=o, reason="x")
    assert refused and body["status"] == 403 and body["detail"][0]["code"] == "forbidden", body
    refused, body = tool(world, "dead_letters", key="key-agent", tenant=A)
    assert refused and body["status"] == 403, body
    failed, body = tool(world, "discard_dead_letter", tenant=A, partition=p, offset=o, reason="the original stands")
    assert not failed and body["effect"] == "pending" and body["memory_id"] is None, body  # a discard is of no fact
    world.caught_up()
    failed, listed = tool(world, "dead_letters", tenant=A, state="discarded")
    assert not failed, listed
    [letter] = listed["dead_letters"]
    assert (letter["partition"], letter["offset"]) == (p, o) and letter["state"] == "discarded", letter
    assert letter["resolution"]["reason"] == "the original stands", letter
    assert listed == world.get("/v1/dead-letters", tenant=A, state="discarded")  # the same answer as over HTTP
    # the discard is an event of the subject the record named: the audit replay shows it beside the original
    replay = world.get("/v1/subjects/user:1/events", tenant=A)["events"]
    discard = [e for e in replay if e["type"] == "deadletter.discarded"]
    assert [e["event"]["dead_letter"] for e in discard] == [{"partition": p, "offset": o}], replay
    closed = f"closes the dead letter at partition {p}, offset {o} (discarded); no fact"
    assert [e["effect"]["detail"] for e in discard] == [closed], discard
    # a discard a raw producer sent naming a letter nobody has is logged, and says it closed none
    raw = {"type": "deadletter.discarded", "tenant": A, "subject": "user:1", "event_id": "ev-discard-none"}
    raw |= {"reason": "r", "dead_letter": {"partition": 0, "offset": 10**9}}
    publish_raw(world.settings, [(f"{A}|user:1".encode(), orjson.dumps(raw))])
    world.caught_up()
    replay = world.get("/v1/subjects/user:1/events", tenant=A)["events"]
    [none] = [e for e in replay if e["event_id"] == "ev-discard-none"]
    assert none["effect"]["detail"].startswith("closes no dead letter"), none["effect"]
    for event_id, detail in ((discard[0]["event_id"], closed), ("ev-discard-none", none["effect"]["detail"])):
        assert world.get(f"/v1/events/{event_id}", tenant=A)["effect"]["detail"] == detail, event_id
    # nothing was deleted; nothing open is left for A; B's letter is still B's and open
    assert world.letters(state="open") == {}
    assert world.letters(B, "key-b")[world.other]["state"] == "open"
    failed, body = tool(world, "redrive_dead_letter", tenant=A, partition=p, offset=o, event=wire("user:1", tenant=A))
    assert failed and body["status"] == 409 and body["detail"][0]["code"] == "dead_letter_resolved", body


def test_the_worker_counts_the_letters_by_state(world: World) -> None:
    """A's two letters resolved (one each way); B's and the nameless record's open."""
    want = {"open": 2.0, "redriven": 1.0, "discarded": 1.0}

    def counted() -> bool:
        text = httpx.get(f"http://127.0.0.1:{world.settings.worker_metrics_port}/metrics", timeout=10).text
        got = {
            s.labels["state"]: s.value
            for family in text_string_to_metric_families(text)
            if family.name == "ledger_worker_dead_letters_by_state"
            for s in family.samples
        }
        return got == want

    wait_for(counted, 30, what=f"ledger_worker_dead_letters_by_state == {want}")


def test_a_replay_of_the_log_in_any_order_changes_nothing(world: World) -> None:
    """Every record applied twice, partitions in reverse order, into a fresh schema: the same letters and states."""
    live = _states(world.settings, world.settings.pg_schema)
    assert {row[5] for row in live} == {"redriven", "discarded", None}, live
    assert _replayed(world) == live


def _replayed(world: World) -> list[tuple[Any, ...]]:
    """The letters and states of the whole log applied twice, partitions in reverse order, into a fresh schema."""
    replay = world.settings.model_copy(
        update={"pg_schema": world.settings.pg_schema + "_replay", "key_schema": world.settings.keys_schema}
    )
    with psycopg.connect(replay.pg_dsn, autocommit=True) as admin:
        create_schema(admin, replay.pg_schema)
    try:
        records = read_topic(world.settings)
        with connect(replay.pg_dsn, replay.pg_schema) as conn:
            keys = key_context(replay, conn)
            conn.commit()
            for consumer in ("replay-1", "replay-2"):  # the second: every record again, as a redelivery
                recorder = Recorder(conn, consumer=consumer, topic=replay.topic, keys=keys)
                for partition in sorted({r.partition for r in records}, reverse=True):
                    batch = [
                        decode_record(r.topic, r.partition, r.offset, r.value, key=r.key, timestamp_ms=r.timestamp)
                        for r in records
                        if r.partition == partition
                    ]
                    recorder.apply_batch(batch)
        return _states(world.settings, replay.pg_schema)
    finally:
        with psycopg.connect(replay.pg_dsn, autocommit=True) as admin:
            drop_schema(admin, replay.pg_schema)


def test_an_erasure_takes_its_subjects_letters_and_leaves_what_it_resolved_resolved(world: World) -> None:
    """Erasing user:1 takes the letter of its own refused record (the sealed conflict, discarded) with the record's
    claimed id, as a replay (which cannot open a record sealed with the destroyed key) never makes it; a letter of
    another subject that a user:1 event resolved stays resolved, by an event whose id and reason went with user:1,
    counted and refused as a resolved one. A replay of the log gives the same letters and states."""
    letter = _letter_resolved_by_user_1(world)
    assert world.letters()[world.conflict]["state"] == "discarded"
    r = world.http.delete("/v1/subjects/user:1", params={"tenant": A}, headers={"X-API-Key": "key-a"})
    assert r.status_code == 202, r.text
    world.caught_up()
    letters = world.letters()
    assert world.conflict not in letters, letters  # user:1's own letter: gone with it, and counted
    [erasure] = world.get("/v1/erasures", tenant=A, subject="user:1")["erasures"]
    assert erasure["purged"]["postgres"]["dead_letters"] == 1, erasure
    after = letters[letter["position"]]
    assert after["state"] == "redriven", letters
    assert after["resolution"] == {**letter["resolution"], "event_id": None, "reason": None}, after
    assert letters[world.malformed]["state"] == "redriven", letters  # a re-drive of user:2's: as it was
    assert letter["position"] not in world.letters(state="open")
    p, o = letter["position"]
    body = {"tenant": A, "partition": p, "offset": o, "reason": "again"}
    r = world.http.post("/v1/dead-letters/discard", json=body, headers={"X-API-Key": "key-a"})
    assert r.status_code == 409 and "erased since" in r.json()["detail"][0]["message"], r.text
    r = world.http.get(
        f"/v1/dead-letters/{world.conflict[0]}/{world.conflict[1]}",
        params={"tenant": A},
        headers={"X-API-Key": "key-a"},
    )
    assert r.status_code == 404, r.text
    with pg(world.settings) as conn:  # the tenant's dead-letter counter follows: a recount finds nothing off
        counted = conn.execute(
            "SELECT coalesce(sum(n), 0) FROM counts WHERE tenant = %s AND name = %s",
            (A, dead_letters_name(world.settings.topic)),
        ).fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM dead_letters WHERE tenant = %s", (A,)).fetchone()[0]
    assert counted == rows, (counted, rows)
    assert _replayed(world) == _states(world.settings, world.settings.pg_schema)


def test_a_letter_refused_after_its_subjects_erasure_stays_whatever_the_batch(world: World) -> None:
    """An erasure and a record refused after it, published together (one batch, as a worker takes them): the
    erasure takes only what was logged before it; the later letter is news it did not cover."""
    before = wire("user:late", tenant=A, event_id="ev-late-before", value="x", content=...)
    erasure = {"type": "subject.erased", "tenant": A, "subject": "user:late", "event_id": "ev-late-erase"}
    after = wire("user:late", tenant=A, event_id="ev-late-after", value="y", content=...)
    key = b"dl-acme|user:late"
    [first, _, last] = publish_raw(world.settings, [(key, orjson.dumps(e)) for e in (before, erasure, after)])
    world.caught_up()
    letters = world.letters()
    assert first not in letters and last in letters, letters
    assert world.get("/v1/events/ev-late-after", tenant=A)["status"] == "dead_lettered"
    assert _replayed(world) == _states(world.settings, world.settings.pg_schema)


def test_an_erasure_takes_the_letters_filed_under_its_subject_and_counts_them(world: World) -> None:
    """The class: a refused record is filed under the subject its JSON names if an event could name it, else under
    its Kafka key's (`tenant|subject`, the key's tenant being the one it claims). Records sent under user:kf's key
    naming no subject, a NUL in it (stored spelled out, `user:kf\\u0000`, a subject an event could name: never what
    it is filed under), or a subject over 256 characters go with user:kf's erasure, which counts them as clear
    records the topic still holds; one naming user:kf-other stays, as does one whose key is another tenant's. A
    replay of the log gives the same letters."""
    subject = "user:kf"
    key = f"{A}|{subject}".encode()
    taken = [
        wire(..., tenant=A, event_id="ev-kf-none", value="secret-1"),
        wire(f"{subject}\x00", tenant=A, event_id="ev-kf-nul", value="secret-2"),
        wire("user:" + "k" * 300, tenant=A, event_id="ev-kf-long", value="secret-3"),
    ]
    kept = [(key, wire("user:kf-other", tenant=A, event_id="ev-kf-other", content=...))]
    kept += [(f"{B}|{subject}".encode(), wire(..., tenant=A, event_id="ev-kf-b-key"))]
    fact = wire(subject, tenant=A, event_id="ev-kf-fact")
    erasure = {"type": "subject.erased", "tenant": A, "subject": subject, "event_id": "ev-kf-erase"}
    positions = publish_raw(
        world.settings, [(key, orjson.dumps(e)) for e in (fact, *taken)] + [(k, orjson.dumps(e)) for k, e in kept]
    )
    wait_for(lambda: set(positions[1:]) <= set(world.letters()), 90, what="the letters listed")
    [erased] = publish_raw(world.settings, [(key, orjson.dumps(erasure))])
    world.caught_up()
    letters = world.letters()
    assert not set(positions[1:4]) & set(letters), letters
    assert positions[4] in letters, letters  # user:kf-other's
    if positions[5][0] == erased[0]:  # under another tenant's key: never user:kf's, whatever the partition
        assert positions[5] in letters, letters
    [record] = world.get("/v1/erasures", tenant=A, subject=subject)["erasures"]
    assert record["purged"]["postgres"]["dead_letters"] == 3, record
    assert (record["records"]["total"], record["records"]["clear"]) == (4, 4), record  # the fact and the 3 letters
    assert _replayed(world) == _states(world.settings, world.settings.pg_schema)


def test_an_erasure_leaves_no_bytes_of_its_subjects_letters_in_other_partitions_whatever_the_order(
    world: World,
) -> None:
    """The class: a record of user:xp sent under another subject's key (so in another partition) or under none is
    refused and filed under user:xp, but its erasure took only the letters of its own partition: the others kept
    the record's bytes, personal data the API still opened. A letter of the subject in another partition keeps its
    place and reason, not its bytes, whether it was recorded before the erasure was applied or after (two partitions
    have no order); one logged after the erasure in its partition is news and keeps them. A replay of the log in
    another partition order gives the same letters, and `ledger verify` finds the ledger intact."""
    from stream_processors.verify import verify

    subject, secret = "user:xp", "xp lives at 12 street"
    own = f"{A}|{subject}".encode()
    [(home, _)] = publish_raw(world.settings, [(own, orjson.dumps(wire(subject, tenant=A, event_id="ev-xp-fact")))])
    keys = [*(f"{A}|user:xp-{n}".encode() for n in range(12)), None, own]

    wrongs = [  # refused for a top-level field, a path into the value, a field the contract lacks: a secret each
        {"confidence": "high", "content": secret},
        {"value": {"xp@example.com": "nul\u0000"}},
        {"xp-secret-field": 1},
    ]

    def refused(n: int) -> list[tuple[bytes | None, bytes]]:  # a refused record of user:xp per key
        return [
            (k, orjson.dumps(wire(subject, tenant=A, event_id=f"ev-xp-{n}-{i}", **wrongs[i % 3])))
            for i, k in enumerate(keys)
        ]

    before = publish_raw(world.settings, refused(1))
    assert {p for p, _ in before} - {home}, before
    world.caught_up()
    erasure = {"type": "subject.erased", "tenant": A, "subject": subject, "event_id": "ev-xp-erase"}
    publish_raw(world.settings, [(own, orjson.dumps(erasure))])
    world.caught_up()
    after = publish_raw(world.settings, refused(2))
    world.caught_up()
    letters = world.letters()
    for at in [*before, *after]:
        if at[0] == home and at in before:
            assert at not in letters, at  # taken by the erasure, as ever
            continue
        assert at in letters, at
        opened = orjson.dumps(world.get(f"/v1/dead-letters/{at[0]}/{at[1]}", tenant=A)).decode()
        quoted = [s for s in ("12 street", "xp@example", "xp-secret") if s in opened]
        assert bool(quoted) == (at[0] == home), (at, opened)  # its own secret, only where news to the erasure
        if at[0] != home:  # the code stays, and a top-level field of the contract's; no word that may quote it
            reason = letters[at]["reason"]
            assert reason["field"] in ("confidence", "value", None) and "withheld" in reason["message"], reason
        assert orjson.loads(opened).get("withheld", False) == (at[0] != home), opened  # said so, not a 0-byte record
    [record] = world.get("/v1/erasures", tenant=A, subject=subject)["erasures"]
    stays = 1 + len(before)  # the fact and every letter refused before it: in the topic, readable or sealed
    taken = sum(1 for at in before if at[0] == home)  # deleted; the others' bytes withheld
    assert (record["records"]["total"], record["purged"]["postgres"]["dead_letters"]) == (stays, taken), record
    assert _replayed(world) == _states(world.settings, world.settings.pg_schema)
    report = verify(world.settings)
    assert report.intact, report.as_json()
    # a letter without its bytes is still filed under its subject: its discard is in that subject's audit replay
    p, o = next(at for at in before if at[0] != home)
    body = {"tenant": A, "partition": p, "offset": o, "reason": "erased anyway"}
    r = world.http.post("/v1/dead-letters/discard", json=body, headers={"X-API-Key": "key-a"})
    assert r.status_code == 200 and r.json()["memory_id"] is None, r.text
    world.caught_up()
    replay = world.get(f"/v1/subjects/{subject}/events", tenant=A)["events"]
    assert [e["event_id"] for e in replay if e["type"] == "deadletter.discarded"] == [f"deadletter:{p}:{o}"], replay


def test_a_resolution_naming_a_letter_after_it_in_its_partition_is_refused(world: World) -> None:
    """The class: a resolution was recorded for any letter it named, so a raw discard naming the next offset of its
    own partition closed the refusal that landed there after it, in advance; kept as an event that closed nothing,
    it would still take the id (`deadletter:<p>:<o>`) that letter's own discard needs, leaving it unresolvable. The
    worker refuses it (a dead letter naming `dead_letter`); the letter stays open and is discarded through the
    door as any other."""
    key = f"{A}|user:ahead".encode()
    [(p, o)] = publish_raw(world.settings, [(key, orjson.dumps(wire("user:ahead", tenant=A, event_id="ev-ahead-0")))])
    ahead = {
        "type": "deadletter.discarded",
        "tenant": A,
        "subject": "user:ahead",
        "event_id": f"deadletter:{p}:{o + 2}",
    }
    ahead |= {"reason": "in advance", "dead_letter": {"partition": p, "offset": o + 2}}
    refused = wire("user:ahead", tenant=A, event_id="ev-ahead-bad", content=...)
    positions = publish_raw(world.settings, [(key, orjson.dumps(ahead)), (key, orjson.dumps(refused))])
    assert positions == [(p, o + 1), (p, o + 2)], positions
    world.caught_up()
    letters = world.letters()
    assert (letters[(p, o + 1)]["reason"]["code"], letters[(p, o + 1)]["reason"]["field"]) == (
        "invalid_value",
        "dead_letter",
    ), letters[(p, o + 1)]
    assert letters[(p, o + 2)]["state"] == "open", letters[(p, o + 2)]
    body = {"tenant": A, "partition": p, "offset": o + 2, "reason": "through the door"}
    r = world.http.post("/v1/dead-letters/discard", json=body, headers={"X-API-Key": "key-a"})
    assert r.status_code == 200, r.text
    world.caught_up()
    assert world.letters()[(p, o + 2)]["state"] == "discarded"
    assert _replayed(world) == _states(world.settings, world.settings.pg_schema)


def test_resolutions_of_one_letter_in_one_batch_leave_the_first_and_the_worker_going_on(world: World) -> None:
    """The class: a batch's rows written by one statement that updates on conflict. Two re-drives and a discard of
    one letter, published raw while the worker waits so that one batch holds them, made that statement touch the
    letter's row twice, which PostgreSQL refuses: the batch was retried forever and every partition stalled. The
    first in ledger position resolves the letter, the others are applied as events that resolve nothing, and the
    event after them is applied."""
    key = f"{A}|user:twice".encode()
    refused = wire("user:twice", tenant=A, event_id="ev-twice-bad", content=...)
    [(p, o)] = publish_raw(world.settings, [(key, orjson.dumps(refused))])
    world.caught_up()
    link = {"dead_letter": {"partition": p, "offset": o}}
    fixes = [wire("user:twice", tenant=A, event_id=f"ev-twice-{n}", value=f"v{n}") | link for n in (1, 2)]
    discard = {"type": "deadletter.discarded", "tenant": A, "subject": "user:twice", "event_id": f"deadletter:{p}:{o}"}
    after = wire("user:twice-after", tenant=A, event_id="ev-twice-after")
    records = [(key, orjson.dumps(e)) for e in (*fixes, discard | link | {"reason": "late"})]
    with frozen(world.worker):
        positions = publish_raw(world.settings, [*records, (f"{A}|user:twice-after".encode(), orjson.dumps(after))])
    assert [q for q, _ in positions[:3]] == [p] * 3, positions
    world.caught_up()
    letter = world.letters()[(p, o)]
    assert letter["state"] == "redriven" and letter["resolution"]["event_id"] == "ev-twice-1", letter
    assert all(_applied(world.settings, A, i) for i in ("ev-twice-1", "ev-twice-2", "ev-twice-after"))
    assert _replayed(world) == _states(world.settings, world.settings.pg_schema)


def _letter_resolved_by_user_1(world: World) -> dict[str, Any]:
    """A letter of user:3's refused record, re-driven as a user:1 event: its position and resolution."""
    broken = wire("user:3", tenant=A, event_id="ev-u3-bad", value="x", content=...)
    [(p, o)] = publish_raw(world.settings, [(b"dl-acme|user:3", orjson.dumps(broken))])
    world.caught_up()
    fixed = wire("user:1", tenant=A, event_id="ev-u1-fix", value="y")
    body = {"tenant": A, "partition": p, "offset": o, "event": fixed}
    r = world.http.post("/v1/dead-letters/redrive", json=body, headers={"X-API-Key": "key-a"})
    assert r.status_code == 200, r.text
    world.caught_up()
    letter = world.letters()[(p, o)]
    assert letter["state"] == "redriven" and letter["resolution"]["event_id"] == "ev-u1-fix", letter
    return {**letter, "position": (p, o)}


def test_one_resolution_a_letter_even_before_the_worker_applies_the_first(world: World) -> None:
    """While a resolution is in flight the letter still reads open, so the door's claim of the letter's own id is
    what refuses the others: a retry is the same event, another re-drive (the same correction under another id too)
    or a discard is 409, and only the first correction is in force once the worker applies the log. `POST
    /v1/events` takes no event naming a letter, and a re-drive the door refuses leaves the letter open."""
    records = [
        (f"dl-acme|user:{n}".encode(), orjson.dumps(wire(f"user:{n}", tenant=A, event_id=f"ev-race-{n}", content=...)))
        for n in (21, 22, 23)
    ]
    (p1, o1), (p2, o2), (p3, o3) = publish_raw(world.settings, records)
    wait_for(lambda: {(p1, o1), (p2, o2), (p3, o3)} <= set(world.letters()), 90, what="the three letters listed")
    key = {"X-API-Key": "key-a"}

    def redrive(p: int, o: int, **event: Any) -> httpx.Response:
        body = {"tenant": A, "partition": p, "offset": o, "event": event}
        return world.http.post("/v1/dead-letters/redrive", json=body, headers=key)

    def discard(p: int, o: int) -> httpx.Response:
        body = {"tenant": A, "partition": p, "offset": o, "reason": "late"}
        return world.http.post("/v1/dead-letters/discard", json=body, headers=key)

    def resolved(r: httpx.Response) -> None:
        assert r.status_code == 409 and r.json()["detail"][0]["code"] == "dead_letter_resolved", r.text

    first = {"type": "memory.asserted", "subject": "user:21", "key": "pref.seat", "value": "first", "content": "f"}
    own = {**first, "subject": "user:22", "event_id": "ev-race-own"}
    with frozen(world.worker):  # every letter reads open meanwhile
        # a re-drive without an id of its own takes the letter's: its retry is the same event (the worker applies
        # an id once; in flight, the door publishes a retry again rather than guess)
        a = redrive(p1, o1, **first)
        assert a.status_code == 200 and a.json()["event_id"] == f"deadletter:{p1}:{o1}", a.text
        again = redrive(p1, o1, **first)
        assert again.status_code == 200 and again.json()["event_id"] == f"deadletter:{p1}:{o1}", again.text
        resolved(redrive(p1, o1, **{**first, "value": "second"}))
        resolved(redrive(p1, o1, **{**first, "value": "third", "event_id": "ev-race-third"}))
        resolved(discard(p1, o1))
        # a re-drive under its own id claims the letter's id beside it
        b = redrive(p2, o2, **own)
        assert b.status_code == 200 and b.json()["event_id"] == "ev-race-own", b.text
        again = redrive(p2, o2, **own)
        assert again.status_code == 200 and again.json()["event_id"] == "ev-race-own", again.text
        resolved(redrive(p2, o2, **{**own, "value": "second"}))
        resolved(redrive(p2, o2, **{**own, "event_id": "ev-race-other", "value": "other"}))
        resolved(redrive(p2, o2, **{**own, "event_id": "ev-race-same"}))  # the same correction twice: no
        resolved(discard(p2, o2))
        # the door of every other write takes no resolution: it would pass the letter's checks and claim
        for p, o in ((p2, o2), (p3, o3), (0, 10**12)):
            linked = {**own, "tenant": A, "event_id": f"ev-side-{p}-{o}", "dead_letter": {"partition": p, "offset": o}}
            r = world.http.post("/v1/events", json={"events": [linked]}, headers=key)
            (result,) = r.json()["results"]
            assert not result["accepted"] and result["error"]["field"] == "events.0.dead_letter", r.text
        # a re-drive the door refuses publishes nothing and leaves the letter open to another action
        refused = redrive(p3, o3, **{**first, "subject": "user:23", "event_id": "ev-orig"})  # id taken by other content
        assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "event.event_id", refused.text
        assert discard(p3, o3).status_code == 200
    world.caught_up()
    assert world.letters()[(p3, o3)]["state"] == "discarded"
    letters = world.letters()
    assert letters[(p1, o1)]["state"] == "redriven", letters[(p1, o1)]
    assert letters[(p1, o1)]["resolution"]["event_id"] == f"deadletter:{p1}:{o1}"
    assert letters[(p2, o2)]["resolution"]["event_id"] == "ev-race-own", letters[(p2, o2)]
    for subject in ("user:21", "user:22"):
        facts = world.get(f"/v1/subjects/{subject}/facts", tenant=A)["facts"]
        assert [(f["key"], f["value"]) for f in facts] == [("pref.seat", "first")], (subject, facts)


def test_a_redrive_the_worker_refuses_leaves_its_letter_open_to_another_action(world: World) -> None:
    """A re-drive under an id of its own claims the letter's id beside it. If a producer that claims no ids (the SDK,
    a raw producer) took that id with other content first, the worker refuses the re-drive's record
    (`event_id_conflict`): the letter was not resolved, so its claim goes with the refusal and the letter can be
    re-driven or discarded again, not 409 for good."""
    record = wire("user:41", tenant=A, event_id="ev-refused-41", content=...)
    [(p, o)] = publish_raw(world.settings, [(b"dl-acme|user:41", orjson.dumps(record))])
    wait_for(lambda: (p, o) in world.letters(), 90, what="the letter listed")
    key = {"X-API-Key": "key-a"}
    own = {"type": "memory.asserted", "subject": "user:41", "key": "pref.seat", "value": "door", "content": "door"}
    with frozen(world.worker):  # the same subject, so one partition: the SDK's record is applied first
        with LedgerProducer(world.settings) as producer:
            producer.publish_many([wire("user:41", tenant=A, event_id="ev-taken-41", value="sdk", content="sdk")])
        body = {"tenant": A, "partition": p, "offset": o, "event": {**own, "event_id": "ev-taken-41"}}
        r = world.http.post("/v1/dead-letters/redrive", json=body, headers=key)
        assert r.status_code == 200, r.text
        refused_at = (r.json()["partition"], r.json()["offset"])
    world.caught_up()
    letters = world.letters()
    assert letters[refused_at]["reason"]["code"] == "event_id_conflict", letters.get(refused_at)
    assert letters[(p, o)]["state"] == "open", letters[(p, o)]
    again = {**body, "event": {**own, "event_id": "ev-again-41", "value": "again"}}
    r = world.http.post("/v1/dead-letters/redrive", json=again, headers=key)
    assert r.status_code == 200, r.text
    world.caught_up()
    assert world.letters()[(p, o)]["resolution"]["event_id"] == "ev-again-41", world.letters()[(p, o)]
    facts = world.get("/v1/subjects/user:41/facts", tenant=A)["facts"]
    assert [(f["key"], f["value"]) for f in facts] == [("pref.seat", "again")], facts
    # resolved by an event of its own id: the letter's id is no event's, so nothing reads it pending (its claim
    # read `pending`, then `unpublished`: "send it again"); the claim itself stays, so that a door which found the
    # letter open a moment before the resolution committed is still refused; a further action is 409 naming the event
    assert world.get(f"/v1/events/deadletter:{p}:{o}", tenant=A)["status"] == "unknown"
    with pg(world.settings) as conn:
        held = conn.execute(
            "SELECT 1 FROM event_claims WHERE tenant = %s AND event_id = %s", (A, f"deadletter:{p}:{o}")
        )
        assert held.fetchall() == [(1,)]
    r = world.http.post(
        "/v1/dead-letters/discard", json={"tenant": A, "partition": p, "offset": o, "reason": "r"}, headers=key
    )
    assert r.status_code == 409 and "ev-again-41" in r.json()["detail"][0]["message"], r.text


def test_no_other_write_can_take_the_id_a_letters_resolution_claims(world: World) -> None:
    """Every resolution of the letter at (p, o) claims the id `deadletter:<p>:<o>`, so that one action resolves it.
    An ordinary write holding such an id (of a letter listed, or of one not there yet), over HTTP or MCP `remember`
    by an agent's key, is refused naming `event_id` and claims nothing; a re-drive of one letter under another
    letter's id is refused too. Both letters are then resolved as usual."""
    records = [
        (f"dl-acme|user:{n}".encode(), orjson.dumps(wire(f"user:{n}", tenant=A, event_id=f"ev-squat-{n}", content=...)))
        for n in (31, 32)
    ]
    (p1, o1), (p2, o2) = publish_raw(world.settings, records)
    wait_for(lambda: {(p1, o1), (p2, o2)} <= set(world.letters()), 90, what="the two letters listed")
    key = {"X-API-Key": "key-agent"}
    squat = {"type": "memory.asserted", "tenant": A, "subject": "user:31", "key": "k", "value": 1, "content": "c"}
    for event_id in (f"deadletter:{p1}:{o1}", f"deadletter:{p2}:{o2 + 1000}", "deadletter:anything"):
        r = world.http.post("/v1/events", json={"events": [{**squat, "event_id": event_id}]}, headers=key)
        (result,) = r.json()["results"]
        assert not result["accepted"] and result["error"]["field"] == "events.0.event_id", r.text
        memory = {k: v for k, v in squat.items() if k != "type"} | {"event_id": event_id}
        failed, body = call_tool(world.mcp, "key-agent", "remember", memory)
        assert failed and body["status"] == 422 and body["detail"][0]["field"] == "event_id", body
    admin = {"X-API-Key": "key-a"}
    body = {"tenant": A, "partition": p2, "offset": o2, "event": {**squat, "event_id": f"deadletter:{p1}:{o1}"}}
    r = world.http.post("/v1/dead-letters/redrive", json=body, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "event.event_id", r.text
    for p, o in ((p1, o1), (p2, o2)):
        r = world.http.post(
            "/v1/dead-letters/discard", json={"tenant": A, "partition": p, "offset": o, "reason": "r"}, headers=admin
        )
        assert r.status_code == 200, r.text
    world.caught_up()
    assert {world.letters()[p]["state"] for p in ((p1, o1), (p2, o2))} == {"discarded"}


def test_an_events_status_says_what_became_of_each_of_its_letters(world: World) -> None:
    """A producer polling its event's fate learns its letter's resolution: open, then redriven under another id
    (naming it), or discarded (naming the discard); the status stays `dead_lettered` (that event was never applied)."""
    key = {"X-API-Key": "key-a"}
    records = [wire(f"user:st{n}", tenant=A, event_id=f"ev-st-{n}", content=...) for n in (1, 2)]
    [(p1, o1), (p2, o2)] = publish_raw(world.settings, [(f"{A}|user:st{n}".encode(), orjson.dumps(r))
                                                          for n, r in zip((1, 2), records, strict=True)])  # fmt: skip
    world.caught_up()
    for n in (1, 2):
        status = world.get(f"/v1/events/ev-st-{n}", tenant=A)
        assert [(d["state"], "resolved_by" in d) for d in status["dead_letters"]] == [("open", False)], status
    fixed = wire("user:st1", tenant=A, event_id="ev-st-1-fixed")
    body = {"tenant": A, "partition": p1, "offset": o1, "event": fixed}
    assert world.http.post("/v1/dead-letters/redrive", json=body, headers=key).status_code == 200
    body = {"tenant": A, "partition": p2, "offset": o2, "reason": "not needed"}
    assert world.http.post("/v1/dead-letters/discard", json=body, headers=key).status_code == 200
    world.caught_up()
    one, two = (world.get(f"/v1/events/ev-st-{n}", tenant=A) for n in (1, 2))
    assert one["status"] == two["status"] == "dead_lettered", (one, two)
    assert [(d["state"], d["resolved_by"]) for d in one["dead_letters"]] == [("redriven", "ev-st-1-fixed")], one
    assert [(d["state"], d["resolved_by"]) for d in two["dead_letters"]] == [("discarded", f"deadletter:{p2}:{o2}")]


def test_a_refused_records_id_goes_with_its_subjects_erasure(world: World) -> None:
    """An erasure takes the letters of its subject's records logged before it, and their ids with them: the refused
    record's id then reads as an erased duplicate, as an applied one's does, and sending it again publishes nothing
    (before, it read `unknown`, or `pending` forever where a door had claimed it, and a re-send came back to life)."""
    broken = wire("user:8", tenant=A, event_id="ev-raw-8", content=...)
    [(p, o)] = publish_raw(world.settings, [(b"dl-acme|user:8", orjson.dumps(broken))])
    world.caught_up()
    key = {"X-API-Key": "key-a"}
    status = world.get("/v1/events/ev-raw-8", tenant=A)
    assert status["status"] == "dead_lettered" and (status["partition"], status["offset"]) == (p, o), status
    r = world.http.delete("/v1/subjects/user:8", params={"tenant": A}, headers=key)
    assert r.status_code == 202, r.text
    world.caught_up()
    assert world.get("/v1/events/ev-raw-8", tenant=A) == {
        "tenant": A, "event_id": "ev-raw-8", "status": "duplicate", "erased": True
    }  # fmt: skip
    again = wire("user:8", tenant=A, event_id="ev-raw-8", value="fine")
    r = world.http.post("/v1/events", json={"events": [again]}, headers=key)
    (result,) = r.json()["results"]
    assert result["duplicate"] and result["erased"] and result.get("partition") is None, r.text


def test_a_letters_log_line_quotes_nothing_of_its_record(world: World) -> None:
    """The worker's line for a dead letter named the field at fault and gave the reason in its words: a name inside
    a value, or an unknown field's name, can be personal (an address, a number), and a log is a copy no erasure
    reaches. The line says the code and the contract field it concerns; the letter keeps the rest."""
    name, inner = "p jane.doe@example.com", "ssn 123-45-6789"
    unknown = {**wire("user:31", tenant=A, event_id="ev-log-1"), name: "x"}
    nested = wire("user:31", tenant=A, event_id="ev-log-2", value={inner: "a\x00b"})
    key = f"{A}|user:31".encode()
    [(p1, o1), (p2, o2)] = publish_raw(world.settings, [(key, orjson.dumps(unknown)), (key, orjson.dumps(nested))])
    wait_for(lambda: {(p1, o1), (p2, o2)} <= set(world.letters()), 90, what="the two letters listed")
    log = world.worker.log()
    assert "jane.doe" not in log and "123-45-6789" not in log, log[-3000:]
    first = [line for line in log.splitlines() if f"/{p1}/{o1}: " in line]
    second = [line for line in log.splitlines() if f"/{p2}/{o2}: " in line]
    assert len(first) == 1 and "unknown_field" in first[0] and "(" + name not in first[0], first
    assert len(second) == 1 and "unstorable_text (value)" in second[0], second
    letters = world.letters()
    assert letters[(p1, o1)]["reason"]["field"] == name and letters[(p2, o2)]["reason"]["field"] == f"value.{inner}"

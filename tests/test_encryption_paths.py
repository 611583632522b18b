"""Every way onto the ledger seals, and every way a sealed record can be wrong is a dead letter, on the
real servers.

- Each producer path (the SDK, `POST /v1/events`, the MCP `remember` tool as the server runs it, `ledger publish`)
  writes sealed records only: the raw topic (a plain kafka-python consumer) holds no marker of any personal field,
  and the API reads the facts back decrypted.
- Records published raw after a good one: a clear field changed (`bad_ciphertext`), sealed with another subject's
  key (`key_mismatch`), an unknown key id (`unknown_key`), a malformed envelope (`bad_envelope`): each is in the
  dead_letters table and on the DLQ topic with its code, and the good event after them is applied.
- `encryption=required`: a clear record with personal fields is `not_encrypted`; a clear erasure and sealed
  records apply.
- Migration: clear records, then sealed ones, of one subject: both project, and its erasure record counts them
  apart (the clear ones stay readable in the log, and the record says so).
- An erasure from a raw producer (which retired no key) still destroys the subject's live key.
- Events around an erasure in one publish: those before it sealed with the key it destroys, those after with a new
  one; a subject erased through one process is sealed anew by another at once (the erasure's notification); an
  event a producer still sealed with the destroyed key is a dead letter `key_destroyed`, never lost unseen.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from unittest.mock import ANY

import orjson
import pytest
from pydantic import SecretStr

from producers.contract import MAX_CONTENT_CHARS, MAX_EVENT_BYTES, InvalidEvent, encode, kafka_key
from producers.keys.envelope import MAX_SEALED_BYTES, DataKey, encode_sealed, parse_envelope
from producers.keys.kek import load_keks
from producers.keys.store import KeyStore, key_states
from producers.records import decode_record
from producers.sdk import LedgerProducer
from projections.postgres.idempotency import erased_sql
from tests.conftest import unique
from tests.support import (
    RecorderWriter,
    asserted,
    dlq_envelopes,
    erased,
    marked,
    pg,
    pipeline,
    publish_raw,
    read_topic,
    wait_for,
)
from tests.support.processes import frozen
from tests.support.stores import private_schema

API_KEY = "enc-paths-key"
TENANT = "acme"
HEADERS = {"X-API-Key": API_KEY}
ROOT = Path(__file__).resolve().parents[1]


def _kek() -> SecretStr:
    return SecretStr(base64.b64encode(os.urandom(32)).decode())


def _markers(path: str) -> dict[str, str]:
    return {f: f"M{path.upper()}{f.upper()}{os.urandom(4).hex()}" for f in ("content", "value", "alias", "entity")}


def _fields(m: dict[str, str]) -> dict:
    """The personal fields of one event (wire JSON), each with its marker; source.ref/actor are markers too."""
    return {
        "value": {"secret": m["value"]},
        "content": f"{m['content']} said so",
        "aliases": [m["alias"]],
        "entities": [m["entity"]],
        "tags": [f"{m['alias']}-tag"],
        "source": {"type": "explicit", "service": "crm", "ref": f"{m['entity']}-ref", "actor": f"{m['value']}-actor"},
    }


def _wire(subject: str, key: str, m: dict[str, str]) -> dict:
    return {"type": "memory.asserted", "tenant": TENANT, "subject": subject, "key": key, **_fields(m)}


def _facts(client, subject: str) -> list[dict]:
    resp = client.get(f"/v1/subjects/{subject}/facts", params={"tenant": TENANT}, headers=HEADERS)
    assert resp.status_code == 200, resp.text
    return resp.json()["facts"]


def _keys_of(settings, key_ids):
    keks = load_keks(settings.kek.get_secret_value(), None)
    with pg(settings) as conn, conn.cursor() as cur:
        return key_states(cur, settings.keys_schema, keks, key_ids)


def _key_store(settings) -> KeyStore:
    return KeyStore(settings.pg_dsn, settings.keys_schema, load_keks(settings.kek.get_secret_value(), None))


def _dead_letters(settings, positions) -> dict[tuple[int, int], tuple[str, str | None]]:
    with pg(settings) as conn:
        rows = conn.execute(
            'SELECT "partition", "offset", code, field FROM dead_letters WHERE topic = %s', (settings.topic,)
        ).fetchall()
    got = {(p, o): (c, f) for p, o, c, f in rows}
    return {pos: got[pos] for pos in positions if pos in got}


@pytest.fixture(scope="module")
def on(base_settings):
    """One ledger with encryption on (worker, indexer, app) for the module's tests; each uses its own subjects."""
    settings = base_settings.private(unique("encp"), encryption="on", kek=_kek(), api_keys={API_KEY: [TENANT]})
    with pipeline(settings, app=True) as pipe:
        yield pipe


# -- every producer path seals ----------------------------------------------------------------------------------


def _remember_through_mcp(settings, subject: str, m: dict[str, str]) -> dict:
    """The MCP `remember` tool as the server runs it (api.mcp.tools.run_tool on the process's Resources)."""
    from api.mcp.tools import TOOLS, run_tool
    from api.resources import Resources

    spec = next(t for t in TOOLS if t.name == "remember")
    arguments = {"event_id": uuid.uuid4().hex, "tenant": TENANT, "subject": subject, "key": "via.mcp", **_fields(m)}

    async def call():
        async with Resources.open(settings, warm_embedder=False) as res:
            return await run_tool(spec, res, frozenset({TENANT}), arguments)

    result = asyncio.run(call())
    assert not result.is_error, result.content
    return result.structured_content


def test_every_producer_path_seals_and_the_api_reads_the_facts_back(on, tmp_path):
    settings, client = on.settings, on.client
    start = {(r.partition, r.offset) for r in read_topic(settings)}
    paths = {p: (f"user:path-{p}", _markers(p)) for p in ("sdk", "http", "mcp", "cli")}

    with LedgerProducer(settings) as producer:  # the SDK
        subject, m = paths["sdk"]
        producer.publish(_wire(subject, "via.sdk", m))

    subject, m = paths["http"]  # POST /v1/events through the app
    resp = client.post("/v1/events", json={"events": [_wire(subject, "via.http", m)]}, headers=HEADERS)
    assert resp.status_code == 200, resp.text

    subject, m = paths["mcp"]
    _remember_through_mcp(settings, subject, m)

    subject, m = paths["cli"]  # `ledger publish` as a child process on the private settings
    lines = tmp_path / "events.jsonl"
    lines.write_bytes(orjson.dumps(_wire(subject, "via.cli", m)) + b"\n")
    run = subprocess.run(
        [sys.executable, "-m", "infra.cli", "publish", str(lines), "--quiet"],
        env=settings.child_environ(),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert b"accepted: 1" in run.stdout

    on.settle()
    new = [r for r in read_topic(settings) if (r.partition, r.offset) not in start]
    by_key = {r.key: r for r in new}
    assert set(by_key) == {kafka_key(TENANT, s) for s, _ in paths.values()}, "one record per path"
    every_marker = [v.encode() for _, m in paths.values() for v in m.values()]
    for record in new:
        assert not [x for x in every_marker if x in record.value], record.value[:300]
        assert parse_envelope(orjson.loads(record.value)) is not None, f"not sealed: {record.value[:300]}"
    for p, (subject, m) in paths.items():
        facts = _facts(client, subject)
        assert [(f["key"], f["content"], f["value"]) for f in facts] == [
            (f"via.{p}", f"{m['content']} said so", {"secret": m["value"]})
        ], p


def test_a_maximal_event_is_sealed_by_the_sdk_and_applied_by_the_worker(on):
    """The largest event the SDK accepts (content at MAX_CONTENT_CHARS of 4-byte characters, a value filling the
    rest up to MAX_EVENT_BYTES) is sealed within MAX_SEALED_BYTES and applied, never dead-lettered."""
    settings, client = on.settings, on.client
    subject = "user:maximal"
    content = "🧠" * MAX_CONTENT_CHARS

    def event(n: int):
        return asserted(subject, "big", {"blob": "é" * n}, 0, tenant=TENANT, content=content)

    n = (MAX_EVENT_BYTES - len(encode(event(0)))) // 2
    big = event(n)
    assert MAX_EVENT_BYTES - 2 < len(encode(big)) <= MAX_EVENT_BYTES
    with LedgerProducer(settings) as producer:
        with pytest.raises(InvalidEvent) as exc:
            producer.check(event(n + 1))  # one more character: refused at the producer, nothing sent
        assert exc.value.code == "too_large"
        done = producer.publish(big)
    on.settle()
    raw = next(r.value for r in read_topic(settings) if (r.partition, r.offset) == (done.partition, done.offset))
    assert parse_envelope(orjson.loads(raw)) is not None and len(raw) <= MAX_SEALED_BYTES
    assert _dead_letters(settings, [(done.partition, done.offset)]) == {}
    facts = _facts(client, subject)
    assert [(f["content"] == content, f["value"] == {"blob": "é" * n}) for f in facts] == [(True, True)]


# -- sealed records that are wrong: dead letters with their code, and the pipeline goes on ---------------------


def test_a_tampered_misskeyed_unknown_or_malformed_record_is_a_dead_letter_and_the_pipeline_goes_on(on):
    settings, client = on.settings, on.client
    subject, other = "user:tamper", "user:tamper-other"
    with LedgerProducer(settings) as producer:
        good = producer.publish(asserted(subject, "good.first", 1, 0, tenant=TENANT, content="first good fact"))
        producer.publish(asserted(other, "other.fact", 1, 0, tenant=TENANT, content="the other subject"))
    on.settle()
    raw = next(r for r in read_topic(settings) if (r.partition, r.offset) == (good.partition, good.offset)).value
    sealed = orjson.loads(raw)

    changed = {**sealed, "key": "good.changed"}  # a clear field changed: the tag no longer matches
    store = _key_store(settings)
    try:
        other_key = store.sealing_keys([(TENANT, other)])[(TENANT, other)]
        own_key = store.sealing_keys([(TENANT, subject)])[(TENANT, subject)]
    finally:
        store.close()
    assert other_key.key_id != own_key.key_id
    theirs = asserted(subject, "sealed.with.theirs", 2, 1, tenant=TENANT, content="sealed with another subject's key")
    unknown = asserted(subject, "sealed.unknown", 3, 1, tenant=TENANT, content="sealed with a key nobody has")
    malformed = {**sealed, "sealed": {**sealed["sealed"], "nonce": "c2hvcnQ="}}
    key = kafka_key(TENANT, subject)
    bad = {
        "bad_ciphertext": orjson.dumps(changed),
        "key_mismatch": encode_sealed(theirs, other_key),
        "unknown_key": encode_sealed(unknown, DataKey(uuid.uuid4().hex, os.urandom(32))),
        "bad_envelope": orjson.dumps(malformed),
    }
    where = dict(zip(bad, publish_raw(settings, [(key, v) for v in bad.values()]), strict=True))
    with LedgerProducer(settings) as producer:  # a good event after them
        producer.publish(asserted(subject, "good.after", 4, 2, tenant=TENANT, content="the good one after"))
    on.settle()

    assert sorted(f["key"] for f in _facts(client, subject)) == ["good.after", "good.first"]
    table = _dead_letters(settings, where.values())
    assert {code: table.get(pos, (None,))[0] for code, pos in where.items()} == {c: c for c in bad}
    assert table[where["bad_envelope"]][1] == "sealed.nonce"
    dlq = dlq_envelopes(settings, want=where.values())
    assert {code: dlq[pos]["code"] for code, pos in where.items()} == {c: c for c in bad}
    for code, pos in where.items():  # the DLQ keeps the record as it was: still sealed, nothing opened into it
        assert base64.b64decode(dlq[pos]["raw_b64"]) == bad[code]
    # the real record is untouched by its tampered copy, and still opens
    assert [f["value"] for f in _facts(client, subject) if f["key"] == "good.first"] == [1]


# -- an erasure from a raw producer still shreds the live key ---------------------------------------------------


def test_an_erasure_published_raw_destroys_the_subjects_live_key(on):
    settings, client = on.settings, on.client
    subject = "user:raw-erasure"
    with LedgerProducer(settings) as producer:
        results = producer.publish_many(
            [asserted(subject, f"k{i}", i, i, tenant=TENANT, content=f"raw erasure fact {i}") for i in range(2)]
        )
    on.settle()
    positions = {(r.partition, r.offset) for r in results}
    kids = {
        parse_envelope(orjson.loads(r.value)).key_id
        for r in read_topic(settings)
        if (r.partition, r.offset) in positions
    }
    assert len(kids) == 1
    assert not next(iter(_keys_of(settings, kids).values())).destroyed

    erasure = erased(subject, tenant=TENANT, reason="raw producer")
    publish_raw(settings, [(erasure.kafka_key, encode(erasure))])  # no SDK: nothing retired the key first
    on.settle()
    states = _keys_of(settings, kids)
    assert [s.destroyed for s in states.values()] == [True]
    assert _facts(client, subject) == []
    rec = client.get(f"/v1/erasures/{erasure.event_id}", params={"tenant": TENANT}, headers=HEADERS)
    assert rec.status_code == 200, rec.text
    assert [k["key_id"] for k in rec.json()["keys"]] == sorted(kids)
    assert rec.json()["records"] == {"total": 2, "sealed": 2, "clear": 0}

    with LedgerProducer(settings) as producer:  # the subject again: a new key, applied
        after = producer.publish(asserted(subject, "k.new", 9, 9, tenant=TENANT, content="after the raw erasure"))
    on.settle()
    new_kid = next(
        parse_envelope(orjson.loads(r.value)).key_id
        for r in read_topic(settings)
        if (r.partition, r.offset) == (after.partition, after.offset)
    )
    assert new_kid not in kids
    assert [f["key"] for f in _facts(client, subject)] == ["k.new"]


def _kid_at(settings, result) -> str:
    """The key id that sealed the record a publish result names."""
    return next(
        parse_envelope(orjson.loads(r.value)).key_id
        for r in read_topic(settings)
        if (r.partition, r.offset) == (result.partition, result.offset)
    )


def test_events_around_an_erasure_in_one_batch_are_sealed_with_the_key_it_destroys_and_a_new_one(on):
    """One publish holds a subject's events before its erasure and after it (and a subject never seen, erased
    first): the ones before are sealed with the key the erasure destroys (its past is shredded, in the log too),
    the ones after with a key it leaves alone, and the producer's next event of the subject (its cache) applies."""
    settings, client = on.settings, on.client
    known, fresh = f"user:batch-erasure-{uuid.uuid4().hex[:8]}", f"user:erased-first-{uuid.uuid4().hex[:8]}"
    with LedgerProducer(settings) as producer:
        before, erasure, after, erasure2, fresh_after = producer.publish_many(
            [
                asserted(known, "k.before", 1, 1, tenant=TENANT, content="said before the erasure"),
                erased(known, tenant=TENANT, reason="one batch"),
                asserted(known, "k.after", 2, 2, tenant=TENANT, content="said after the erasure"),
                erased(fresh, tenant=TENANT, reason="a subject without a key yet"),
                asserted(fresh, "k.after", 3, 3, tenant=TENANT, content="the first thing it says"),
            ]
        )
        on.settle()
        next_one = producer.publish(asserted(known, "k.next", 4, 4, tenant=TENANT, content="said a moment later"))
        on.settle()
    assert erasure.event_id and erasure2.event_id
    kid_before, kid_after, kid_next = _kid_at(settings, before), _kid_at(settings, after), _kid_at(settings, next_one)
    states = _keys_of(settings, {kid_before, kid_after, kid_next, _kid_at(settings, fresh_after)})
    assert states[kid_before].destroyed
    assert kid_after != kid_before and not states[kid_after].destroyed
    assert kid_next == kid_after
    assert not states[_kid_at(settings, fresh_after)].destroyed
    assert sorted(f["key"] for f in _facts(client, known)) == ["k.after", "k.next"]
    assert [f["key"] for f in _facts(client, fresh)] == ["k.after"]


def test_a_subject_erased_through_one_process_is_sealed_anew_by_another_at_once(on):
    """Two processes with their own key caches (the app's, and the Resources an MCP server runs on): the first
    erases a subject whose key the second holds; the erasure's notification makes the second drop it, so its next
    event is sealed with a new key and applied, not sealed with the destroyed one and lost."""
    from api.mcp.tools import TOOLS, run_tool
    from api.resources import Resources

    settings, client = on.settings, on.client
    subject = f"user:two-doors-{uuid.uuid4().hex[:8]}"
    remember = next(t for t in TOOLS if t.name == "remember")

    async def scenario() -> tuple[dict, dict]:
        async with Resources.open(settings, warm_embedder=False) as res:
            assert res.keys is not None

            async def say(key: str, value: str) -> dict:
                args = {"event_id": uuid.uuid4().hex, "tenant": TENANT, "subject": subject, "key": key, "value": value}
                result = await run_tool(remember, res, frozenset({TENANT}), {**args, "content": f"{key} is {value}"})
                assert not result.is_error, result.content
                return result.structured_content

            first = await say("pref.color", "red")
            assert (TENANT, subject) in res.keys._cache  # this process now holds the subject's key
            await asyncio.to_thread(on.settle)
            gone = await asyncio.to_thread(
                client.delete, f"/v1/subjects/{subject}", params={"tenant": TENANT}, headers=HEADERS
            )
            assert gone.status_code == 202, gone.text
            for _ in range(200):  # the notification reaches this process's listener
                if (TENANT, subject) not in res.keys._cache:
                    break
                await asyncio.sleep(0.05)
            assert (TENANT, subject) not in res.keys._cache
            return first, await say("pref.color", "blue")

    first, second = asyncio.run(scenario())
    on.settle()
    assert _kid_at_offset(settings, second) != _kid_at_offset(settings, first)
    assert [(f["key"], f["value"]) for f in _facts(client, subject)] == [("pref.color", "blue")]


@pytest.mark.parametrize("worker_frozen", [False, True], ids=["erasure-applied-first", "one-batch"])
def test_an_event_sealed_with_a_key_its_erasure_destroyed_is_a_dead_letter_never_lost_unseen(on, worker_frozen):
    """A producer that cannot hear erasures (an SDK with its own key cache) seals a subject's next event with the
    key another process's erasure of it destroys: the worker cannot open it, and it is a dead letter
    (`key_destroyed`, its status says so), whether the erasure was applied in an earlier batch or in the same one;
    the producer's earlier events of the subject are its erased past (no dead letter)."""
    settings, client = on.settings, on.client
    subject = f"user:stale-key-{uuid.uuid4().hex[:8]}"
    with LedgerProducer(settings) as stale, LedgerProducer(settings) as other:
        before = stale.publish(asserted(subject, "k.before", 1, 1, tenant=TENANT, content="before"))
        on.settle()
        if worker_frozen:
            with frozen(on.worker):
                other.erase_subject(TENANT, subject, reason="by another process")
                late = stale.publish(asserted(subject, "k.after", 2, 2, tenant=TENANT, content="after"))
        else:
            other.erase_subject(TENANT, subject, reason="by another process")
            on.settle()
            late = stale.publish(asserted(subject, "k.after", 2, 2, tenant=TENANT, content="after"))
        on.settle()
    assert _kid_at(settings, late) == _kid_at(settings, before)  # the stale cache's key
    letters = _dead_letters(settings, [(before.partition, before.offset), (late.partition, late.offset)])
    assert letters == {(late.partition, late.offset): ("key_destroyed", "sealed.kid")}, letters
    status = client.get(f"/v1/events/{late.event_id}", params={"tenant": TENANT}, headers=HEADERS).json()
    assert status["status"] == "dead_lettered" and status["reason"]["code"] == "key_destroyed", status
    assert _facts(client, subject) == []


def test_an_event_between_two_erasures_of_its_subject_stays_erased_when_sent_again(on):
    """The `key_destroyed` letter of an event logged between two erasures of its subject is the second erasure's
    past: it goes with it and its id answers for the event, so a re-send through the door is an erased duplicate
    and nothing comes back."""
    settings, client = on.settings, on.client
    subject = f"user:twice-erased-{uuid.uuid4().hex[:8]}"
    between = asserted(subject, "k.between", 2, 2, tenant=TENANT, content="between")
    with LedgerProducer(settings) as stale, LedgerProducer(settings) as other:
        stale.publish(asserted(subject, "k.before", 1, 1, tenant=TENANT, content="before"))
        on.settle()
        other.erase_subject(TENANT, subject, reason="first")
        on.settle()
        late = stale.publish(between)  # sealed with the key the first erasure destroyed (the stale cache's)
        on.settle()
        assert _dead_letters(settings, [(late.partition, late.offset)]) == {(late.partition, late.offset): ANY}
        other.erase_subject(TENANT, subject, reason="second")
        on.settle()
    assert _dead_letters(settings, [(late.partition, late.offset)]) == {}  # gone with the second erasure
    again = client.post("/v1/events", json={"events": [between.to_wire()]}, headers=HEADERS)
    (result,) = again.json()["results"]
    assert result["accepted"] and result["duplicate"] and result.get("erased"), result
    on.settle()
    assert _facts(client, subject) == []


@pytest.mark.parametrize("together", [False, True], ids=["one-at-a-time", "one-batch"])
def test_a_letter_between_two_erasures_of_its_subject_goes_with_the_second_in_any_batching(on, together):
    """The two erasures and the record sealed with the key the first destroys, logged between them, in one batch:
    its letter was written after both and dropped as their past, its id kept by nothing (a re-send through a door
    was applied after the erasure asked for after it). Now it ends as one record at a time: the second erasure
    takes the letter and keeps its id."""
    settings = on.settings.model_copy(update={"pg_schema": unique("encb")})
    subject = f"user:twice-{uuid.uuid4().hex[:8]}"
    store = _key_store(settings)
    try:
        key = store.sealing_keys([(TENANT, subject)])[(TENANT, subject)]
    finally:
        store.close()
    between = asserted(subject, "k.between", 2, 2, tenant=TENANT, content="between")
    raws = [
        encode_sealed(asserted(subject, "k.before", 1, 1, tenant=TENANT, content="before"), key),
        encode(erased(subject, tenant=TENANT, reason="first")),
        encode_sealed(between, key),
        encode(erased(subject, tenant=TENANT, reason="second")),
    ]
    now = int(time.time() * 1000)
    records = [
        decode_record(settings.topic, 0, n, raw, key=kafka_key(TENANT, subject), timestamp_ms=now + n)
        for n, raw in enumerate(raws)
    ]
    with private_schema(settings) as conn, RecorderWriter(settings) as writer:
        batches = [records[:1], records[1:]] if together else [[r] for r in records]
        for batch in batches:
            writer.recorder.apply_batch(batch)
        letters = conn.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
        kept = conn.execute(erased_sql(with_fingerprints=False), ([TENANT], [between.event_id])).fetchall()
    assert letters == 0 and kept == [(TENANT, between.event_id)], (letters, kept)


@pytest.mark.parametrize("worker_frozen", [False, True], ids=["erasure-applied-first", "one-batch"])
def test_another_subjects_event_sealed_with_an_erased_subjects_key_is_a_key_mismatch_in_any_batching(on, worker_frozen):
    """A record after an erasure in its partition, naming another subject and sealed with the erased subject's key,
    is refused for the key's owner (`key_mismatch`), whether its batch held the erasure or came after it."""
    settings = on.settings
    subject, other = f"user:owner-{uuid.uuid4().hex[:8]}", f"user:not-owner-{uuid.uuid4().hex[:8]}"
    with LedgerProducer(settings) as producer:
        producer.publish(asserted(subject, "k.before", 1, 1, tenant=TENANT, content="before"))
    on.settle()
    store = _key_store(settings)
    try:
        owners_key = store.sealing_keys([(TENANT, subject)])[(TENANT, subject)]
    finally:
        store.close()
    forged = encode_sealed(asserted(other, "k.forged", 2, 2, tenant=TENANT, content="forged"), owners_key)

    def erase_then_forge() -> tuple[int, int]:
        with LedgerProducer(settings) as producer:
            producer.erase_subject(TENANT, subject, reason="test")
        if not worker_frozen:
            on.settle()
        return publish_raw(settings, [(kafka_key(TENANT, subject), forged)])[0]

    if worker_frozen:
        with frozen(on.worker):
            where = erase_then_forge()
    else:
        where = erase_then_forge()
    on.settle()
    assert _dead_letters(settings, [where]) == {where: ("key_mismatch", "sealed.kid")}


def _kid_at_offset(settings, answer: dict) -> str:
    return next(
        parse_envelope(orjson.loads(r.value)).key_id
        for r in read_topic(settings)
        if (r.partition, r.offset) == (answer["partition"], answer["offset"])
    )


# -- migration: clear records first, sealed ones later ---------------------------------------------------------


def test_a_topic_with_clear_then_sealed_records_projects_both_and_the_erasure_counts_them_apart(on):
    settings, client = on.settings, on.client
    subject = "user:migrated"
    m_clear, m_sealed = _markers("clear"), _markers("sealed")
    clear_producer = settings.model_copy(update={"encryption": "off"})  # before the migration
    with LedgerProducer(clear_producer) as producer:
        old = producer.publish_many([_wire(subject, f"old.k{i}", m_clear) for i in range(2)])
    with LedgerProducer(settings) as producer:  # a new producer, encryption on
        new = producer.publish_many([_wire(subject, f"new.k{i}", m_sealed) for i in range(3)])
    on.settle()
    facts = _facts(client, subject)
    assert sorted(f["key"] for f in facts) == ["new.k0", "new.k1", "new.k2", "old.k0", "old.k1"]
    assert {f["content"] for f in facts} == {f"{m_clear['content']} said so", f"{m_sealed['content']} said so"}

    raw = {(r.partition, r.offset): r.value for r in read_topic(settings)}
    for r in old:
        assert parse_envelope(orjson.loads(raw[(r.partition, r.offset)])) is None
        assert m_clear["content"].encode() in raw[(r.partition, r.offset)]
    for r in new:
        assert parse_envelope(orjson.loads(raw[(r.partition, r.offset)])) is not None
        assert not [v for v in m_sealed.values() if v.encode() in raw[(r.partition, r.offset)]]

    resp = client.delete(f"/v1/subjects/{subject}", params={"tenant": TENANT}, headers=HEADERS)
    assert resp.status_code == 202, resp.text
    erasure_id = resp.json()["event_id"]
    on.settle()
    erasure_raw = next(r.value for r in read_topic(settings) if erasure_id.encode() in r.value)
    assert parse_envelope(orjson.loads(erasure_raw)) is None  # an erasure is never sealed: it outlives its key
    rec = client.get(f"/v1/erasures/{erasure_id}", params={"tenant": TENANT}, headers=HEADERS)
    assert rec.status_code == 200, rec.text
    assert rec.json()["records"] == {"total": 5, "sealed": 3, "clear": 2}
    assert _facts(client, subject) == []
    after = {(r.partition, r.offset): r.value for r in read_topic(settings)}
    # what the record says: the clear records are still readable in the log; the sealed ones no longer open
    assert all(m_clear["content"].encode() in after[(r.partition, r.offset)] for r in old)
    kids = {parse_envelope(orjson.loads(after[(r.partition, r.offset)])).key_id for r in new}
    assert all(s.destroyed for s in _keys_of(settings, kids).values())


# -- encryption required ----------------------------------------------------------------------------------------


def test_with_encryption_required_a_clear_record_with_personal_fields_is_refused_and_the_rest_applies(base_settings):
    settings = base_settings.private(unique("encr"), encryption="required", kek=_kek(), api_keys={API_KEY: [TENANT]})
    sealed_subject, clear_subject = "user:req-sealed", "user:req-clear"
    with pipeline(settings, indexer=False, app=True) as pipe:
        client = pipe.client
        with LedgerProducer(settings) as producer:
            sealed = producer.publish_many(
                [
                    asserted(sealed_subject, "k", 1, 0, tenant=TENANT, content="sealed under required"),
                    asserted(clear_subject, "k", 1, 0, tenant=TENANT, content="sealed before the clear ones"),
                ]
            )
        clear_fact = asserted(clear_subject, "k.clear", 2, 1, tenant=TENANT, content="a clear fact")
        clear_retraction = marked("memory.retracted", clear_subject, "k", 2, tenant=TENANT, reason="a clear reason")
        clear_erasure = erased(clear_subject, tenant=TENANT, reason="required allows a clear erasure")
        where = publish_raw(settings, [(e.kafka_key, encode(e)) for e in (clear_fact, clear_retraction)])
        pipe.settle()
        raw = {(r.partition, r.offset): r.value for r in read_topic(settings)}
        assert all(parse_envelope(orjson.loads(raw[(r.partition, r.offset)])) is not None for r in sealed)

        table = _dead_letters(settings, where)
        assert table == {where[0]: ("not_encrypted", "sealed"), where[1]: ("not_encrypted", "sealed")}
        where += publish_raw(settings, [(clear_erasure.kafka_key, encode(clear_erasure))])
        pipe.settle()
        # the erasure takes the subject's letters (their clear personal fields with them); the DLQ topic keeps the
        # records, as the ledger topic keeps a clear record's
        assert _dead_letters(settings, where) == {}
        dlq = dlq_envelopes(settings, want=where[:2])
        assert {dlq[pos]["code"] for pos in where[:2]} == {"not_encrypted"}
        assert [f["content"] for f in _facts(client, sealed_subject)] == ["sealed under required"]
        assert _facts(client, clear_subject) == []  # the clear erasure was applied

        def recorded():
            r = client.get(f"/v1/erasures/{clear_erasure.event_id}", params={"tenant": TENANT}, headers=HEADERS)
            return r.json() if r.status_code == 200 else None

        rec = wait_for(recorded, 30, what="the clear erasure's record")
        # the two refused clear records count: the topic still holds their personal fields in clear
        assert rec["records"] == {"total": 3, "sealed": 1, "clear": 2}

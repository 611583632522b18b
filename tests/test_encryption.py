"""Crypto-shredding end to end, against the real servers: sealed on the wire, shredded by erasure.

Two subjects are published with encryption on; one is erased through the API. Then the raw topic is read with a
plain kafka-python consumer: no clear text of either subject is in any record's bytes, the erased subject's records
name a key the store has destroyed, the other's still open with its live key; re-publishing the erased subject's
old records resurrects nothing; a new fact about it applies under a new key; the erasure record holds counts, key
ids and offsets but no personal data; a rebuild from offset 0 gives the live checksum.
"""

from __future__ import annotations

import base64
import os

import orjson
import pytest
from pydantic import SecretStr

from producers.contract import DeadLetterRef, kafka_key
from producers.keys.envelope import encode_sealed, parse_envelope
from producers.keys.kek import load_keks
from producers.keys.store import KeyStore, SubjectDigests, key_states
from producers.records import decode_record, open_record
from producers.sdk import LedgerProducer
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.support import asserted, pg, pipeline, publish_raw, read_topic, wait_for

KEY = "enc-key"
TENANT = "acme"
GONE, KEPT = "user:erase-me", "user:keep-me"
OTHER = "globex"  # another tenant, whose name a forged record takes


def _kek() -> SecretStr:
    return SecretStr(base64.b64encode(os.urandom(32)).decode())


def _markers(subject: str) -> dict[str, str]:
    tag = subject.split(":")[1].upper().replace("-", "")
    return {
        f: f"{tag}-{f}-{os.urandom(4).hex()}" for f in ("content", "value", "alias", "entity", "tag", "ref", "actor")
    }


def _events(subject: str, m: dict[str, str]) -> list:
    return [
        asserted(
            subject,
            f"profile.k{i}",
            {"secret": m["value"], "i": i},
            i,
            tenant=TENANT,
            content=f"{m['content']} fact {i}",
            aliases=[m["alias"]],
            entities=[m["entity"]],
            tags=[m["tag"]],
            source={"type": "explicit", "service": "crm", "ref": m["ref"], "actor": m["actor"]},
        )
        for i in range(3)
    ]


@pytest.fixture
def enc(base_settings):
    return base_settings.private(unique("enc"), encryption="on", kek=_kek(), api_keys={KEY: [TENANT]})


def _keys_of(settings, key_ids):
    keks = load_keks(settings.kek.get_secret_value(), None)
    with pg(settings) as conn, conn.cursor() as cur:
        return key_states(cur, settings.keys_schema, keks, key_ids)


def _dead_letter_codes(settings, positions) -> dict[tuple[int, int], str]:
    with pg(settings) as conn:
        rows = conn.execute('SELECT "partition", "offset", code FROM dead_letters WHERE topic = %s', (settings.topic,))
        return {(p, o): code for p, o, code in rows if (p, o) in set(positions)}


def _resolutions(settings, tenant) -> list[tuple]:
    with pg(settings) as conn:
        return conn.execute(
            'SELECT "partition", "offset", state FROM dead_letter_resolutions WHERE tenant = %s', (tenant,)
        ).fetchall()


def test_erasure_shreds_the_subjects_records_in_the_log_and_a_rebuild_agrees(enc):
    gone_m, kept_m = _markers(GONE), _markers(KEPT)
    gone_events = _events(GONE, gone_m)
    with pipeline(enc, seed=gone_events + _events(KEPT, kept_m), app=True) as pipe:
        client = pipe.client
        headers = {"X-API-Key": KEY}
        facts = client.get(f"/v1/subjects/{GONE}/facts", params={"tenant": TENANT}, headers=headers).json()
        assert sorted(f["content"] for f in facts["facts"]) == [f"{gone_m['content']} fact {i}" for i in range(3)]

        raw = read_topic(enc)
        assert len(raw) == 6
        every_marker = [v.encode() for v in (*gone_m.values(), *kept_m.values())]
        for record in raw:  # sealed at rest: no personal field in clear, for either subject
            assert not [m for m in every_marker if m in record.value], record.value[:300]
            assert parse_envelope(orjson.loads(record.value)) is not None

        # a raw producer's record sealed with the erased-to-be subject's key that speaks for another tenant: it
        # claims to re-drive that tenant's dead letter. A dead letter itself (key_mismatch), live and in a rebuild
        # after the key is destroyed: its clear fields never resolve another tenant's letter
        [letter] = publish_raw(enc, [(kafka_key(OTHER, "user:x"), orjson.dumps({"tenant": OTHER, "type": "x"}))])
        store = KeyStore(enc.pg_dsn, enc.keys_schema, load_keks(enc.kek.get_secret_value(), None))
        try:
            gone_key = store.sealing_keys([(TENANT, GONE)])[(TENANT, GONE)]
        finally:
            store.close()
        posing = asserted(
            "user:x", "k", 1, tenant=OTHER, dead_letter=DeadLetterRef(partition=letter[0], offset=letter[1])
        )
        [forged] = publish_raw(enc, [(kafka_key(TENANT, GONE), encode_sealed(posing, gone_key))])
        pipe.settle()
        assert _dead_letter_codes(enc, [letter, forged]) == {letter: "missing_field", forged: "key_mismatch"}
        assert _resolutions(enc, OTHER) == []

        erased = client.delete(f"/v1/subjects/{GONE}", params={"tenant": TENANT}, headers=headers)
        assert erased.status_code == 202, erased.text
        erasure_id = erased.json()["event_id"]
        pipe.settle()

        # the erasure record: present, complete once the indexer deleted the documents, no personal data
        def record():
            r = client.get(f"/v1/erasures/{erasure_id}", params={"tenant": TENANT}, headers=headers)
            return r.json() if r.status_code == 200 and r.json()["complete"] else None

        rec = wait_for(record, 60, what="the erasure record to be complete")
        text = orjson.dumps(rec)
        assert GONE.encode() not in text and not [m for m in every_marker if m in text]
        with pg(enc) as conn:  # the tenant's keyed digest (HMAC under its digest key), which the store computes
            keks = load_keks(enc.kek.get_secret_value(), None)
            assert rec["subject_digest"] == SubjectDigests(enc.keys_schema, keks).digest(conn.cursor(), TENANT, GONE)
        assert rec["records"] == {"total": 3, "sealed": 3, "clear": 0}
        assert rec["purged"]["postgres"]["versions"] == 3 and rec["purged"]["elasticsearch"]["documents"] == 3
        assert rec["purged"]["postgres"]["dead_letters"] == 0
        assert len(rec["keys"]) == 1
        gone_raw = [r for r in raw if r.key == kafka_key(TENANT, GONE)]
        assert {r.partition for r in gone_raw} == {rec["ledger"]["partition"]}
        assert rec["ledger"]["first_offset"] == min(r.offset for r in gone_raw)
        assert rec["ledger"]["erasure_offset"] > max(r.offset for r in gone_raw)
        listed = client.get("/v1/erasures", params={"tenant": TENANT, "subject": GONE}, headers=headers).json()
        assert [e["erasure_id"] for e in listed["erasures"]] == [erasure_id]

        # the raw log after the erasure: the erased subject's records are sealed with a destroyed key, the other
        # subject's still open with its live key (a plain kafka-python consumer read them)
        kids = {parse_envelope(orjson.loads(r.value)).key_id: r.key for r in raw}
        states = _keys_of(enc, kids)
        assert {k for k, s in states.items() if s.destroyed} == {rec["keys"][0]["key_id"]}
        for r in raw:
            opened = open_record(decode_record(r.topic, r.partition, r.offset, r.value, timestamp_ms=r.timestamp), None)
            state = states[opened.key_id or parse_envelope(orjson.loads(r.value)).key_id]
            if r.key == kafka_key(TENANT, KEPT):
                ok = open_record(
                    decode_record(r.topic, r.partition, r.offset, r.value, timestamp_ms=r.timestamp), state.key
                )
                assert ok.event is not None and ok.event.content.startswith(kept_m["content"])
            else:
                assert state.destroyed

        # re-publishing the erased subject's old records (their exact bytes) resurrects nothing
        publish_raw(enc, [(r.key, r.value) for r in gone_raw])
        pipe.settle()
        assert (
            client.get(f"/v1/subjects/{GONE}/facts", params={"tenant": TENANT}, headers=headers).json()["facts"] == []
        )

        # a new fact about the subject, from a new producer: a new key, applied
        with LedgerProducer(enc) as producer:
            producer.publish(asserted(GONE, "profile.new", 1, 10, tenant=TENANT, content="a new start"))
        pipe.settle()
        now = client.get(f"/v1/subjects/{GONE}/facts", params={"tenant": TENANT}, headers=headers).json()["facts"]
        assert [f["content"] for f in now] == ["a new start"]

        kept = client.get(f"/v1/subjects/{KEPT}/facts", params={"tenant": TENANT}, headers=headers).json()["facts"]
        assert len(kept) == 3

        pipe.worker.stop()
        report = rebuild(enc, keep_old=False)
        assert report.live_checksum == report.rebuilt_checksum
        assert _dead_letter_codes(enc, [letter, forged]) == {letter: "missing_field", forged: "key_mismatch"}
        assert _resolutions(enc, OTHER) == [], "the replay of a record sealed with a destroyed key resolved nothing"

        # the rebuilt projection still knows the shredded events' ids (the replay could not open them): an old id
        # re-sent is a duplicate of an erased event, the old id with other content a conflict
        old = gone_events[0].to_wire()
        other = {**old, "content": "something else under an erased id"}
        [same], [changed] = (
            client.post("/v1/events", json={"events": [e]}, headers=headers).json()["results"] for e in (old, other)
        )
        assert same["accepted"] and same["duplicate"] and same["erased"], same
        assert changed["error"]["code"] == "event_id_conflict", changed

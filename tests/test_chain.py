"""The tamper-evident ledger: the chain over every record the projection takes, signed checkpoints, `ledger verify`.

Unit: the link function (sha256 over the previous link and the record's position, key and value, framed so no two
records hash alike), the checkpoint message and its Ed25519 signature, when a checkpoint is due, what an events row
must hold for a record, the local signing key infra makes (0600, once).

On the real servers (a private ledger each, the worker as it runs): an intact ledger verifies (in process and as
`ledger verify --json`, exit 0) and its stored heads are the chain recomputed from the raw topic; each way of
changing the record behind the ledger's back is found with its partition and offset, exit 1: a record produced raw
with a forged position (and a forged head), the topic rewritten with one record changed, a stored head changed, an
events row edited in PostgreSQL; a checkpoint with one byte changed fails its signature, one signed by another key
is untrusted; an erasure with encryption on leaves chain and checkpoints valid (also verified without the KEK, and
after a rebuild that can no longer open the shredded records); a rebuild reproduces the same heads and keeps the
checkpoints; an idle partition's head is signed by the worker's timer; a batch bisected around poison records chains
each record once; a schema from before the chain chains from where it stood (verify tells that from a removed
chain) and a rebuild chains it from offset 0.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import struct
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psycopg
import pytest
from kafka import KafkaProducer
from pydantic import SecretStr

from producers.contract import encode
from producers.keys.signing import (
    ChainSigner,
    SigningKeyError,
    load_signer,
    new_signing_key,
    parse_public_key,
    public_key_text,
)
from producers.settings import Settings
from producers.topics import ensure_topics
from projections.postgres.chain import (
    GENESIS,
    Checkpoint,
    Checkpoints,
    Head,
    chain,
    checkpoint_message,
    checkpoint_valid,
    link,
    read_checkpoints,
    read_heads,
)
from projections.postgres.schema import create_schema
from stream_processors.rebuild import rebuild
from stream_processors.verify import expected_event_row, last_erasures, row_differences, verify
from tests.conftest import unique
from tests.support import (
    Worker,
    asserted,
    drop_topics,
    erased,
    facts,
    pg,
    pipeline,
    publish_raw,
    read_topic,
    wait_caught_up,
    wait_for,
)

TOPIC = "memory.events"


def _key_file(tmp: Path) -> Path:
    path = tmp / "chain-key"
    path.write_bytes(new_signing_key())
    path.chmod(0o600)
    return path


def _settings(base: Settings, tmp: Path, **update: object) -> Settings:
    return base.private(unique("chn"), chain_key_file=_key_file(tmp), **update)


def _recomputed(settings: Settings) -> dict[int, tuple[bytes, int, int]]:
    """partition -> (link, last offset, count) of the whole raw topic, from GENESIS, by the link function."""
    out: dict[int, tuple[bytes, int, int]] = {}
    for m in sorted(read_topic(settings), key=lambda m: (m.partition, m.offset)):
        prev, _, count = out.get(m.partition, (GENESIS, -1, 0))
        out[m.partition] = (link(prev, m.partition, m.offset, m.key, m.value), m.offset, count + 1)
    return out


def _heads(settings: Settings) -> dict[int, Head]:
    with pg(settings) as conn:
        return read_heads(conn, settings.processor_group, settings.topic)


def _checkpoints(settings: Settings) -> list[Checkpoint]:
    with pg(settings) as conn:
        return read_checkpoints(conn, settings.processor_group, settings.topic)


def _ledger(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args],
        env=settings.child_environ(),
        capture_output=True,
        text=True,
        timeout=300,
    )


# -- unit: the pure parts -----------------------------------------------------------------------------------------


@pytest.mark.unit
def test_a_link_is_sha256_over_the_previous_link_the_position_and_the_framed_bytes() -> None:
    prev = hashlib.sha256(b"x").digest()
    frame = prev + struct.pack(">iqqq", 3, 17, 2, 5) + b"ky" + b"value"
    assert link(prev, 3, 17, b"ky", b"value") == hashlib.sha256(frame).digest()
    assert link(prev, 3, 17, None, None) == hashlib.sha256(prev + struct.pack(">iqqq", 3, 17, -1, -1)).digest()
    base = link(prev, 3, 17, b"ky", b"value")
    # every input counts, and no two records frame alike: a null is not an empty value, bytes do not slide across
    others = {
        link(GENESIS, 3, 17, b"ky", b"value"),
        link(prev, 4, 17, b"ky", b"value"),
        link(prev, 3, 18, b"ky", b"value"),
        link(prev, 3, 17, b"kyv", b"alue"),
        link(prev, 3, 17, b"ky", b"valuf"),
        link(prev, 3, 17, None, b"value"),
        link(prev, 3, 17, b"", b"value"),
    }
    assert base not in others and len(others) == 7
    assert link(prev, 3, 17, b"", b"") != link(prev, 3, 17, None, None)
    assert len(base) == 32 and GENESIS == hashlib.sha256(b"memory-ledger chain v1").digest()


@pytest.mark.unit
def test_a_chain_folds_links_in_log_order() -> None:
    records = [(0, b"k", b"a"), (1, None, b"b"), (5, b"k", b"c")]
    step = GENESIS
    for offset, key, value in records:
        step = link(step, 2, offset, key, value)
    assert chain(GENESIS, 2, records) == step
    assert chain(GENESIS, 2, list(reversed(records))) != step
    assert chain(GENESIS, 2, []) == GENESIS


@pytest.mark.unit
def test_a_checkpoint_signature_covers_every_field_and_no_secret_is_needed_to_check_it() -> None:
    signer = ChainSigner.of_pem(new_signing_key())
    head = Head(partition=1, head=hashlib.sha256(b"h").digest(), offset=41, count=40, first_offset=2)
    cp = Checkpoint(head, signer.key_id, signer.public, signer.sign(checkpoint_message(TOPIC, head)))
    assert checkpoint_valid(TOPIC, cp)
    assert not checkpoint_valid("other.topic", cp)
    for changed in (
        Head(2, head.head, 41, 40, 2),
        Head(1, head.head, 42, 40, 2),
        Head(1, head.head, 41, 41, 2),
        Head(1, head.head, 41, 40, 0),
        Head(1, bytes([head.head[0] ^ 1]) + head.head[1:], 41, 40, 2),
    ):
        assert not checkpoint_valid(TOPIC, Checkpoint(changed, cp.key_id, cp.public_key, cp.signature)), changed
    flipped = bytes([cp.signature[0] ^ 1]) + cp.signature[1:]
    assert not checkpoint_valid(TOPIC, Checkpoint(head, cp.key_id, cp.public_key, flipped))
    other = ChainSigner.of_pem(new_signing_key())
    assert not checkpoint_valid(TOPIC, Checkpoint(head, other.key_id, other.public, cp.signature))
    assert not checkpoint_valid(TOPIC, Checkpoint(head, cp.key_id, b"short", cp.signature))  # malformed: invalid


@pytest.mark.unit
def test_every_nth_link_is_signed_and_a_head_that_grew_after_t_seconds() -> None:
    policy = Checkpoints(ChainSigner.of_pem(new_signing_key()), every_records=100, every_s=60.0)
    assert [c for c in range(1, 350) if policy.boundary(c)] == [100, 200, 300]  # wherever batches end
    assert policy.due(1, None, None)  # a chain's first head is signed at once
    assert not policy.due(150, 100, 5.0) and policy.due(101, 100, 60.0)
    assert not policy.due(100, 100, 600.0)  # time counts only once the chain grew


@pytest.mark.unit
def test_an_events_row_must_hold_what_its_record_says() -> None:
    event = asserted("user:1", "pref.seat", "window")
    row = expected_event_row(event, "kid-1")
    stored = dict(row)
    assert row_differences(row, stored) == []
    assert row["fingerprint"] == event.fingerprint and row["memory_id"] == event.memory_id
    assert row_differences(row, {**stored, "payload": {**row["payload"], "value": "aisle"}}) == ["payload"]
    assert row_differences(row, {**stored, "fingerprint": "0" * 32, "key_id": None}) == ["fingerprint", "key_id"]
    assert expected_event_row(erased("user:1"), None)["memory_id"] is None
    logged = datetime(2026, 1, 2, tzinfo=UTC)  # kept for an erasure only: it orders it against other partitions
    assert expected_event_row(erased("user:1"), None, logged)["logged_at"] == logged
    assert expected_event_row(event, "kid-1", logged)["logged_at"] is None


@pytest.mark.unit
def test_infra_makes_a_private_local_signing_key_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infra import service

    monkeypatch.delenv("LEDGER_CHAIN_KEY_FILE", raising=False)
    local = Settings(development=True, data_dir=tmp_path / "data")
    child = service.service_settings(local)
    path = tmp_path / "data" / "chain-key"
    assert child.chain_key_file == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    first = load_signer(path)
    assert first is not None
    path.chmod(0o644)
    assert service.service_settings(local).chain_key_file == path
    assert load_signer(path).public == first.public and stat.S_IMODE(path.stat().st_mode) == 0o600  # kept, private
    own = tmp_path / "own-key"
    own.write_bytes(new_signing_key())
    assert service.service_settings(local.model_copy(update={"chain_key_file": own})).chain_key_file == own


# -- on the real servers ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ledger(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory):
    """One clear ledger (worker only): events over several partitions, a raw record that is dead-lettered,
    a duplicate; checkpoints every 5 records."""
    settings = _settings(base_settings, tmp_path_factory.mktemp("chain"), chain_checkpoint_records=5)
    seed = [e for i in range(12) for e in facts(f"user:{i}", {"pref.seat": "window", "pref.meal": i})]
    with pipeline(settings, seed=seed, indexer=False) as pipe:
        publish_raw(settings, [(b"acme|user:0", b"{not json"), (b"acme|user:1", seed[2].model_dump_json().encode())])
        pipe.publish([asserted("user:1", "pref.seat", "aisle", 1)])
        pipe.caught_up()
        yield pipe


def test_an_intact_ledger_verifies_and_its_heads_are_the_chain_of_the_raw_topic(ledger) -> None:
    settings = ledger.settings
    heads = _heads(settings)
    recomputed = _recomputed(settings)
    assert len(recomputed) > 1, "the events should spread over several partitions"
    assert {p: (h.head, h.offset, h.count) for p, h in heads.items()} == recomputed
    assert all(h.first_offset == 0 for h in heads.values())
    cps = _checkpoints(settings)
    assert cps and all(checkpoint_valid(settings.topic, cp) for cp in cps)
    assert {cp.key_id for cp in cps} == {load_signer(settings.chain_key_file).key_id}

    report = verify(settings)
    assert report.intact, report.as_json()
    assert report.dead_letters_checked == 1 and report.events_checked == 25, report.as_json()
    assert sum(p.records for p in report.partitions) == sum(c for _, _, c in recomputed.values())

    proc = _ledger(settings, "verify", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    body = orjson.loads(proc.stdout)
    assert body["intact"] is True and body["first_divergence"] is None, body
    assert {p["partition"]: p["head"]["head"] for p in body["partitions"]} == {
        p: h.head.hex() for p, h in heads.items()
    }


def test_an_edited_events_row_is_found_at_its_position(ledger) -> None:
    settings = ledger.settings
    with pg(settings) as conn:
        p, o, payload = conn.execute(
            "SELECT \"partition\", \"offset\", payload FROM events WHERE subject = 'user:7' AND key = 'pref.meal'"
        ).fetchone()
        conn.execute(
            "UPDATE events SET payload = jsonb_set(payload, '{value}', '70') "
            'WHERE "partition" = %s AND "offset" = %s',
            (p, o),
        )
        try:
            report = verify(settings)
            proc = _ledger(settings, "verify")
        finally:
            conn.execute(
                'UPDATE events SET payload = %s WHERE "partition" = %s AND "offset" = %s',
                (orjson.dumps(payload).decode(), p, o),
            )
    assert not report.intact
    first = report.first
    assert (first.kind, first.partition, first.offset) == ("projection", p, o), report.as_json()
    assert "payload" in first.message
    assert proc.returncode == 1 and f"partition {p} offset {o}" in proc.stdout, proc.stdout + proc.stderr
    assert verify(settings).intact  # restored: nothing else was wrong


def test_a_version_row_edited_or_taken_from_its_assertion_is_found_at_its_position(ledger) -> None:
    """The rows the fold derives are checked too: a fact in force edited to retracted is not what its events fold
    to, and a version row moved off its assertion leaves the assertion without one."""
    settings = ledger.settings
    with pg(settings) as conn:
        p, o = conn.execute(
            'SELECT "partition", "offset" FROM fact_versions '
            "WHERE subject = 'user:1' AND key = 'pref.seat' AND status = 'active'"
        ).fetchone()
        where = 'WHERE "partition" = %s AND "offset" = %s'
        conn.execute(f"UPDATE fact_versions SET status = 'retracted', valid_to = valid_from {where}", (p, o))
        try:
            retracted = verify(settings)
        finally:
            conn.execute(f"UPDATE fact_versions SET status = 'active', valid_to = NULL {where}", (p, o))
        conn.execute(f"UPDATE fact_versions SET event_id = event_id || '-moved' {where}", (p, o))
        try:
            moved = verify(settings)
        finally:
            conn.execute(f"UPDATE fact_versions SET event_id = left(event_id, -6) {where}", (p, o))
    assert [(d.kind, d.partition, d.offset) for d in retracted.divergences] == [("projection", p, o)], retracted
    assert "fold to: valid_to, status" in retracted.first.message, retracted.first
    found = sorted(d.message for d in moved.divergences if (d.partition, d.offset) == (p, o))
    assert len(found) == 2 and "has no version row" in found[0] and "has no assertion" in found[1], found
    assert verify(settings).intact  # restored: nothing else was wrong


def test_a_changed_checkpoint_fails_its_signature_and_another_key_is_not_trusted(ledger) -> None:
    settings = ledger.settings
    cp = _checkpoints(settings)[-1]
    h = cp.head
    where = 'WHERE consumer = %s AND topic = %s AND "partition" = %s AND first_offset = %s AND count = %s'
    ids = (settings.processor_group, settings.topic, h.partition, h.first_offset, h.count)
    with pg(settings) as conn:
        for column in ("signature", "head"):  # one byte of the signature, then one of the signed head
            conn.execute(
                f"UPDATE chain_checkpoints SET {column} = set_byte({column}, 5, get_byte({column}, 5) # 1) {where}", ids
            )
            report = verify(settings)
            conn.execute(
                f"UPDATE chain_checkpoints SET {column} = set_byte({column}, 5, get_byte({column}, 5) # 1) {where}", ids
            )
            assert not report.intact, column
            assert [(d.kind, d.partition, d.offset) for d in report.divergences] == [
                ("signature", h.partition, h.offset)
            ]
        # re-signed by a key the verifier does not trust: a valid signature, an untrusted signer
        forger = ChainSigner.of_pem(new_signing_key())
        conn.execute(
            f"UPDATE chain_checkpoints SET key_id = %s, public_key = %s, signature = %s {where}",
            (forger.key_id, forger.public, forger.sign(checkpoint_message(settings.topic, h)), *ids),
        )
        try:
            report = verify(settings)
            trusting = verify(settings.model_copy(update={"chain_trusted_keys": [public_key_text(forger.public)]}))
        finally:
            conn.execute(
                f"UPDATE chain_checkpoints SET key_id = %s, public_key = %s, signature = %s {where}",
                (cp.key_id, cp.public_key, cp.signature, *ids),
            )
    assert [(d.kind, d.partition, d.offset) for d in report.divergences] == [("untrusted_key", h.partition, h.offset)]
    assert trusting.intact, trusting.as_json()  # the auditor who trusts both keys
    assert verify(settings).intact


def test_a_changed_head_is_found(ledger) -> None:
    settings = ledger.settings
    h = max(_heads(settings).values(), key=lambda h: h.count)
    with pg(settings) as conn:
        conn.execute(
            'UPDATE chain_heads SET head = %s WHERE consumer = %s AND topic = %s AND "partition" = %s',
            (hashlib.sha256(b"forged").digest(), settings.processor_group, settings.topic, h.partition),
        )
        try:
            report = verify(settings)
        finally:
            conn.execute(
                'UPDATE chain_heads SET head = %s WHERE consumer = %s AND topic = %s AND "partition" = %s',
                (h.head, settings.processor_group, settings.topic, h.partition),
            )
    assert [(d.kind, d.partition, d.offset) for d in report.divergences] == [("chain", h.partition, h.offset)]
    assert report.first.after is not None and report.first.after < h.offset


def test_a_record_produced_behind_the_ledgers_back_is_found_with_its_position(base_settings, tmp_path) -> None:
    settings = _settings(base_settings, tmp_path)
    with pipeline(settings, seed=facts("user:1", {"a": 1, "b": 2, "c": 3}), indexer=False) as pipe:
        pipe.worker.stop()
        assert verify(settings).intact
        forged = asserted("user:1", "d", 4, event_id="forged-1")
        ((p, k),) = publish_raw(settings, [(b"acme|user:1", forged.model_dump_json().encode())])
        head = _heads(settings)[p]
        with pg(settings) as conn:
            # the positions moved past it, as if the projection had taken it
            conn.execute(
                'UPDATE positions SET next_offset = %s WHERE consumer = %s AND topic = %s AND "partition" = %s',
                (k + 1, settings.processor_group, settings.topic, p),
            )
            moved = verify(settings)
            # and a head forged to cover it with the public link function: the chain agrees, the projection does not
            value = next(m.value for m in read_topic(settings) if (m.partition, m.offset) == (p, k))
            conn.execute(
                'UPDATE chain_heads SET head = %s, "offset" = %s, count = count + 1 '
                'WHERE consumer = %s AND topic = %s AND "partition" = %s',
                (link(head.head, p, k, b"acme|user:1", value), k, settings.processor_group, settings.topic, p),
            )
            forged_head = verify(settings)
    assert ("unchained", p, k) in [(d.kind, d.partition, d.offset) for d in moved.divergences], moved.as_json()
    assert (moved.first.partition, moved.first.offset) == (p, k)
    assert [(d.kind, d.partition, d.offset) for d in forged_head.divergences] == [("projection", p, k)]
    assert "forged-1" in forged_head.first.message


def test_a_topic_rewritten_with_one_record_changed_is_found_at_that_record(base_settings, tmp_path) -> None:
    settings = _settings(base_settings, tmp_path, chain_checkpoint_records=1, topic_partitions=1)
    seed = facts("user:1", {f"k{i}": i for i in range(8)})
    with pipeline(settings, seed=seed, indexer=False) as pipe:
        pipe.worker.stop()
        original = read_topic(settings)
        assert verify(settings).intact
        # the topic deleted and produced again with the same records but one (the broker stamps them anew)
        drop_topics(settings, settings.topic)
        wait_for(lambda: not _topic_exists(settings), 60, 0.5, "the topic to be deleted")
        ensure_topics(settings)
        producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
        try:
            for m in original:
                value = m.value.replace(b'"value":5', b'"value":6') if m.offset == 5 else m.value
                producer.send(settings.topic, key=m.key, value=value, partition=0)
            producer.flush(30)
        finally:
            producer.close(5)
        assert b'"value":5' in original[5].value
        report = verify(settings)
    kinds = [(d.kind, d.partition, d.offset) for d in report.divergences]
    assert (report.first.partition, report.first.offset) == (0, 5), report.as_json()
    assert ("chain", 0, 5) in kinds and ("projection", 0, 5) in kinds, kinds  # the checkpoint at 5, and the row
    assert next(d for d in report.divergences if d.kind == "chain").after == 4


def _topic_exists(settings: Settings) -> bool:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        return settings.topic in admin.list_topics()
    finally:
        admin.close()


def test_an_erasure_with_encryption_on_keeps_the_chain_and_checkpoints_valid(base_settings, tmp_path) -> None:
    kek = SecretStr(__import__("base64").b64encode(os.urandom(32)).decode())
    settings = _settings(base_settings, tmp_path, encryption="on", kek=kek, chain_checkpoint_records=2)
    seed = [*facts("user:gone", {"email": "ann@example.com", "city": "Oslo"}), *facts("user:stays", {"city": "Rome"})]
    with pipeline(settings, seed=seed, indexer=False) as pipe:
        before = _checkpoints(settings)
        assert before and verify(settings).intact
        raw = b"".join(m.value for m in read_topic(settings))
        assert b"ann@example.com" not in raw  # sealed: no personal data in the log, so none in the chain
        pipe.publish([erased("user:gone")])
        pipe.caught_up()
        with pg(settings) as conn:
            assert (
                conn.execute("SELECT count(*) FROM events WHERE subject = 'user:gone' AND key IS NOT NULL").fetchone()[
                    0
                ]
                == 0
            )
        after = _checkpoints(settings)
        assert set(after) >= set(before)  # the checkpoints signed before the erasure are kept as they were
        assert {p: (h.head, h.offset, h.count) for p, h in _heads(settings).items()} == _recomputed(settings)
        report = verify(settings)
        assert report.intact, report.as_json()
        with pg(settings) as conn:  # the erasure's log time decides which records of other partitions it covers
            conn.execute("UPDATE events SET logged_at = logged_at + interval '1 day' WHERE type = 'subject.erased'")
            try:
                moved = verify(settings)
            finally:
                conn.execute("UPDATE events SET logged_at = logged_at - interval '1 day' WHERE type = 'subject.erased'")
        assert moved.first is not None and "logged_at" in moved.first.message, moved.as_json()
        with pg(settings) as conn:  # one from before the column: let be, and said
            (stamp,) = conn.execute("SELECT logged_at FROM events WHERE type = 'subject.erased'").fetchone()
            conn.execute("UPDATE events SET logged_at = NULL WHERE type = 'subject.erased'")
            try:
                unstamped = verify(settings)
            finally:
                conn.execute("UPDATE events SET logged_at = %s WHERE type = 'subject.erased'", (stamp,))
        assert unstamped.intact and any("without its log time" in n for n in unstamped.notes), unstamped.as_json()
        no_kek = verify(settings.model_copy(update={"kek": None}))  # the chain needs no secret
        assert no_kek.intact and no_kek.sealed_unopened > 0, no_kek.as_json()
        assert any("not opened" in n for n in no_kek.notes)
        # a replay cannot open the shredded records any more, and chains them all the same
        heads = _heads(settings)
        assert rebuild(settings, keep_old=False).live_checksum is not None
        assert _heads(settings) == heads
        assert verify(settings).intact


def test_a_rebuild_reproduces_the_heads_and_an_idle_head_gets_signed(base_settings, tmp_path) -> None:
    settings = _settings(base_settings, tmp_path, chain_checkpoint_records=1_000_000, chain_checkpoint_s=1.0)
    with pipeline(settings, seed=facts("user:1", {"a": 1, "b": 2}), indexer=False) as pipe:
        first = _checkpoints(settings)
        assert first and all(cp.head.count == _heads(settings)[cp.head.partition].count for cp in first)
        pipe.publish([*facts("user:1", {"c": 3}), *facts("user:2", {"a": 1})])
        pipe.caught_up()
        heads = _heads(settings)

        def signed() -> bool:  # no record comes any more: the worker's timer signs the heads after 1 s
            last = {cp.head.partition: cp.head.count for cp in _checkpoints(settings)}
            return all(last.get(p) == h.count for p, h in heads.items())

        wait_for(signed, 30, 0.3, "the idle heads to be signed")
        kept = _checkpoints(settings)
        report = rebuild(settings, keep_old=False)
        assert report.live_checksum == report.rebuilt_checksum
        assert _heads(settings) == heads
        assert {(c.head, c.signature) for c in _checkpoints(settings)} >= {(c.head, c.signature) for c in kept}
        pipe.publish([*facts("user:3", {"a": 1})])
        wait_caught_up(settings, worker=pipe.worker)
        assert verify(settings).intact


def test_a_batch_bisected_around_poison_records_chains_every_record_once(base_settings, tmp_path) -> None:
    """Halves committed and rolled back in turn (projections.postgres.positioned): the chain is the log's."""
    settings = _settings(base_settings, tmp_path, chain_checkpoint_records=3)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    with pg(settings) as conn:
        conn.execute("ALTER TABLE events ADD CONSTRAINT poison_key CHECK (key IS DISTINCT FROM 'forbidden.key')")
    events = [asserted("user:1", "forbidden.key" if i in (4, 11) else f"k{i}", i) for i in range(16)]
    placed = publish_raw(settings, [(b"acme|user:1", encode(e)) for e in events])  # one partition, one batch
    (p,) = {p for p, _ in placed}
    with pipeline(settings, indexer=False) as pipe:
        assert "bisecting" in pipe.worker.log()
        with pg(settings) as conn:
            dead = conn.execute('SELECT "offset", code FROM dead_letters ORDER BY 1').fetchall()
        assert dead == [(placed[4][1], "unstorable"), (placed[11][1], "unstorable")]
        head = _heads(settings)[p]
        assert (head.head, head.offset, head.count) == _recomputed(settings)[p]
        counts = sorted(cp.head.count for cp in _checkpoints(settings) if cp.head.partition == p)
        assert {3, 6, 9, 12, 15} <= set(counts), counts
        report = verify(settings)
        assert report.intact and report.dead_letters_checked == 2, report.as_json()
        # the subject's erasure takes its letters with it (the records stay in the log): still intact, and a rebuild
        # from offset 0 makes the same (no letter)
        pipe.publish([erased("user:1")])
        pipe.caught_up()
        with pg(settings) as conn:
            assert conn.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
        report = verify(settings)
        assert report.intact and report.dead_letters_checked == 0, report.as_json()
        built = rebuild(settings, keep_old=False)
        assert built.live_checksum == built.rebuilt_checksum
        with pg(settings) as conn:
            assert conn.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
        assert verify(settings).intact


def test_a_schema_from_before_the_chain_chains_from_where_it_stood_and_a_rebuild_from_offset_0(
    base_settings, tmp_path
) -> None:
    settings = _settings(base_settings, tmp_path, topic_partitions=1)
    with pipeline(settings, seed=facts("user:1", {"a": 1, "b": 2}), indexer=False) as pipe:
        pipe.worker.stop()
        with pg(settings) as conn:  # the projection as a worker before the chain left it
            conn.execute("DROP TABLE chain_heads, chain_checkpoints, chain_starts")
            conn.execute("DELETE FROM meta WHERE name = 'chain'")
        old = verify(settings)
        assert not old.chained and [(d.kind, d.offset) for d in old.divergences] == [("unchained", 0)], old.as_json()
        pipe.worker = Worker(settings).start()  # this version: the tables come, the chain starts where it stands
        pipe.publish(facts("user:1", {"c": 3}))
        pipe.caught_up()
        (head,) = _heads(settings).values()
        assert (head.first_offset, head.offset, head.count) == (2, 2, 1)
        upgraded = verify(settings)
        assert upgraded.intact and any("before offset 2 predate the chain" in n for n in upgraded.notes), upgraded.notes
        with pg(settings) as conn:  # its head removed: not taken for a chain that began later
            conn.execute("DELETE FROM chain_heads")
        assert [(d.kind, d.offset) for d in verify(settings).divergences] == [("unchained", 2)]
        pipe.worker.stop()
        with pg(settings) as conn:
            conn.execute(
                "INSERT INTO chain_heads VALUES (%s, %s, 0, %s, %s, %s, %s)",
                (settings.processor_group, settings.topic, head.head, head.offset, head.count, head.first_offset),
            )
        rebuild(settings, keep_old=False)  # replays from offset 0: the whole ledger chained, the old checkpoints kept
        (full,) = _heads(settings).values()
        assert (full.first_offset, full.offset, full.count) == (0, 2, 3)
        assert (full.head, full.offset, full.count) == _recomputed(settings)[0]
        assert {cp.head.first_offset for cp in _checkpoints(settings)} == {0, 2}
        rebuilt = verify(settings)
        assert rebuilt.intact and not any("predate" in n for n in rebuilt.notes), rebuilt.as_json()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not base64 at all!", "'not base64 at all!' is not valid base64"),
        (base64.b64encode(b"p" * 16).decode(), "is 16 bytes; an Ed25519 public key has 32"),
    ],
)
def test_a_malformed_trusted_key_names_its_problem(text: str, problem: str) -> None:
    with pytest.raises(SigningKeyError, match=problem):
        parse_public_key(text)
    assert parse_public_key(f" {public_key_text(b'p' * 32)}\n") == b"p" * 32  # as configured, spaces around


@pytest.mark.unit
def test_a_subject_erased_twice_is_taken_at_its_last_erasure_whatever_order_the_rows_come_in() -> None:
    """The rows come from PostgreSQL in no order: a subject erased twice took the erasure read last, the first
    of them when the rows came backwards, and the refused records between its two erasures (whose letters the
    second took) read as records with no dead letter."""
    erasure = {"type": "subject.erased", "tenant": "acme", "subject": "user:1"}
    rows = {859: erasure, 851: {**erasure, "type": "memory.asserted"}, 849: erasure, 7: {**erasure, "subject": "u:2"}}
    for ordered in (rows, dict(sorted(rows.items()))):
        assert last_erasures(ordered) == {("acme", "user:1"): 859, ("acme", "u:2"): 7}

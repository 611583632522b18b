"""Crypto-shredding under faults, against the real servers.

1. A worker killed (-9) between the purge and the key destruction: both run in the worker's one transaction, so
   nothing of the erasure commits, and its restart does all of it. The window is made real from outside: the test
   holds a row lock on the subject's data key, the worker purges and then blocks on that lock, and is killed there.
2. A missing or wrong key-encryption key fails loudly at start (worker, SDK, API), never per record; malformed KEK
   configuration names its problem (unit tests on producers.keys.kek).
3. A producer without database credentials or KEK seals with data keys from the API (`POST /v1/keys`), and the
   key endpoint refuses what it must (tenant, API key, bodies, no KEK) and is never cached.
"""

from __future__ import annotations

import base64
import os
import time
import uuid

import httpx
import orjson
import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql
from pydantic import SecretStr

from producers.keys.envelope import parse_envelope
from producers.keys.kek import KekError, load_keks, parse_keks
from producers.keys.provider import RemoteKeys
from producers.keys.store import SubjectDigests
from producers.sdk import LedgerProducer
from producers.settings import Settings
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.support import (
    Worker,
    asserted,
    cleanup,
    pg,
    pipeline,
    positions,
    publish,
    publish_raw,
    read_topic,
    wait_for,
)
from tests.support.servers import ApiServer

KEY = "encf-key"
TENANT = "acme"
GONE, KEPT = "user:crash-gone", "user:crash-kept"


def _kek() -> SecretStr:
    return SecretStr(base64.b64encode(os.urandom(32)).decode())


@pytest.fixture
def enc(base_settings: Settings) -> Settings:
    return base_settings.private(unique("encf"), encryption="on", kek=_kek(), api_keys={KEY: [TENANT]})


def _ks(settings: Settings, table: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(settings.keys_schema), sql.Identifier(table))


def _digest(conn: psycopg.Connection, settings: Settings, subject: str) -> str:
    """The subject's keyed digest in the key store (its tenant's digest key, unwrapped with the test's KEK)."""
    keks = load_keks(settings.kek.get_secret_value(), None)
    return SubjectDigests(settings.keys_schema, keks).digest(conn.cursor(), TENANT, subject)


def _keys_of(conn: psycopg.Connection, settings: Settings, subject: str) -> list[tuple]:
    """(key_id, live, retired, erasure_id) of the subject's data keys, oldest first."""
    return conn.execute(
        sql.SQL(
            "SELECT key_id, wrapped IS NOT NULL AND destroyed_at IS NULL, retired_at IS NOT NULL, erasure_id "
            "FROM {} WHERE tenant = %s AND subject_digest = %s ORDER BY created_at, key_id"
        ).format(_ks(settings, "data_keys")),
        (TENANT, _digest(conn, settings, subject)),
    ).fetchall()


def _erasures_of(conn: psycopg.Connection, settings: Settings, subject: str) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            sql.SQL("SELECT erasure_id FROM {} WHERE tenant = %s AND subject_digest = %s").format(
                _ks(settings, "erasures")
            ),
            (TENANT, _digest(conn, settings, subject)),
        ).fetchall()
    ]


def _facts(conn: psycopg.Connection, subject: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM fact_versions WHERE tenant = %s AND subject = %s", (TENANT, subject)
    ).fetchone()[0]


def _events(subject: str) -> list:
    return [
        asserted(subject, f"profile.k{i}", {"i": i}, i, tenant=TENANT, content=f"{subject} secret {i}")
        for i in range(3)
    ]


# -- 1. kill -9 between the purge and the key deletion ------------------------------------------------------------


def _blocked_backend(watch: psycopg.Connection, locker_pid: int, settings: Settings) -> tuple | None:
    """The backend waiting for our row lock with a statement on the key store's data_keys (the key destruction)."""
    row = watch.execute(
        "SELECT pid, wait_event_type, query, backend_xid IS NOT NULL FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND %s = ANY(pg_blocking_pids(pid)) "
        "AND query LIKE '%%data_keys%%' AND position(%s in query) > 0",
        (locker_pid, settings.keys_schema),
    ).fetchone()
    return row


def _write_locks(watch: psycopg.Connection, pid: int, schema: str) -> set[str]:
    """The tables of `schema` that backend `pid` holds a RowExclusiveLock on (it wrote them in its transaction)."""
    rows = watch.execute(
        "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE l.pid = %s AND l.granted AND l.mode = 'RowExclusiveLock' AND n.nspname = %s AND c.relkind = 'r'",
        (pid, schema),
    ).fetchall()
    return {r[0] for r in rows}


def _key_of(conn, enc, key_id: str) -> tuple:
    (found,) = [k for k in _keys_of(conn, enc, GONE) if k[0] == key_id]
    return found


def test_kill9_between_the_purge_and_the_key_destruction_then_the_restart_completes_the_erasure(enc):
    with pipeline(enc, seed=_events(GONE) + _events(KEPT), indexer=False) as pipe, pg(enc) as watch:
        assert _facts(watch, GONE) == 3 and _facts(watch, KEPT) == 3
        (gone_key,) = _keys_of(watch, enc, GONE)
        assert gone_key[1] and not gone_key[2]
        erasure_id = uuid.uuid4().hex

        with LedgerProducer(enc) as producer:
            # the SDK's erase_subject retires the subject's key first (an UPDATE of the row we lock): do that
            # retire here, with the erasure's id, before taking the lock; the SDK's own retire then matches only
            # the key it asks for the subject just before (a new one, as this one is retired), not this row
            assert producer.keys is not None and producer.keys.retire(TENANT, GONE, erasure_id) == 1
            locker = psycopg.connect(enc.pg_dsn)
            try:
                locked = locker.execute(
                    sql.SQL("SELECT key_id FROM {} WHERE tenant = %s AND subject_digest = %s FOR UPDATE").format(
                        _ks(enc, "data_keys")
                    ),
                    (TENANT, _digest(locker, enc, GONE)),
                ).fetchall()
                assert [r[0] for r in locked] == [gone_key[0]]
                producer.erase_subject(TENANT, GONE, reason="crash test", event_id=erasure_id)

                blocked = wait_for(
                    lambda: _blocked_backend(watch, locker.info.backend_pid, enc),
                    60,
                    0.1,
                    "the worker to block on the data key's row lock",
                )
                pid, wait_type, query, has_xid = blocked
                assert wait_type == "Lock" and "UPDATE" in query and has_xid, blocked
                # the purge ran in that same, still open transaction: it holds write locks on the projection's
                # tables, while every other connection still sees the subject's facts (nothing committed)
                assert {"fact_versions", "events", "erased_events"} <= _write_locks(watch, pid, enc.pg_schema)
                assert _facts(watch, GONE) == 3
                assert _erasures_of(watch, enc, GONE) == []

                pipe.worker.kill()  # kill -9 while it waits between the purge and the key destruction
            finally:
                locker.rollback()  # release the row lock
                locker.close()

        # the dead worker's backend finds its client gone and rolls back: nothing of the erasure committed
        wait_for(
            lambda: watch.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 0,
            30,
            0.1,
            "the killed worker's backend to end",
        )
        assert _facts(watch, GONE) == 3
        assert _key_of(watch, enc, gone_key[0]) == (gone_key[0], True, True, None)  # retired, still live
        assert _erasures_of(watch, enc, GONE) == []

        pipe.worker = Worker(enc).start()
        pipe.caught_up(120)
        assert _facts(watch, GONE) == 0 and _facts(watch, KEPT) == 3
        assert _key_of(watch, enc, gone_key[0]) == (gone_key[0], False, True, erasure_id)  # destroyed by it
        assert all(not live for _, live, _, _ in _keys_of(watch, enc, GONE))  # the SDK's new key: destroyed too
        wrapped = watch.execute(
            sql.SQL("SELECT wrapped FROM {} WHERE key_id = %s").format(_ks(enc, "data_keys")), (gone_key[0],)
        ).fetchone()[0]
        assert wrapped is None
        assert [k[1] for k in _keys_of(watch, enc, KEPT)] == [True]
        assert _erasures_of(watch, enc, GONE) == [erasure_id]
        assert watch.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0

        # the erasure's exact record delivered again (a producer unsure of the outcome): no second erasure record
        (again,) = [r for r in read_topic(enc) if b"subject.erased" in r.value]
        publish_raw(enc, [(again.key, again.value)])
        pipe.caught_up(60)
        assert _erasures_of(watch, enc, GONE) == [erasure_id]
        assert watch.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0

        pipe.worker.stop()
        report = rebuild(enc, keep_old=False)
        assert report.live_checksum == report.rebuilt_checksum
        assert _erasures_of(watch, enc, GONE) == [erasure_id]  # the rebuild's replay of the erasure records nothing


# -- 2. a wrong or missing KEK fails loudly at start ----------------------------------------------------------------


def _exits(worker: Worker, timeout: float = 60.0) -> tuple[int, str, float]:
    """Start `worker`, wait for it to exit by itself; (return code, log, seconds)."""
    t0 = time.monotonic()
    worker.start()
    try:
        wait_for(lambda: not worker.alive(), timeout, 0.2, "the worker to refuse to start")
    finally:
        worker.kill()
    assert worker.proc is not None
    return worker.proc.returncode, worker.log(), time.monotonic() - t0


@pytest.fixture
def kek_settings(base_settings: Settings):
    settings = base_settings.private(unique("kekf"), encryption="on", kek=_kek(), api_keys={KEY: [TENANT]})
    try:
        yield settings
    finally:
        cleanup(settings)


def _dead_letters(settings: Settings) -> int:
    with pg(settings) as conn:
        return conn.execute("SELECT count(*) FROM dead_letters").fetchone()[0]


def test_a_missing_kek_stops_the_worker_and_the_producer_at_start(kek_settings):
    no_kek = kek_settings.model_copy(update={"kek": None})
    code, log, took = _exits(Worker(no_kek))
    assert code != 0, log[-2000:]
    assert "KekError" in log and "LEDGER_KEK" in log, log[-2000:]
    assert took < 60
    with pytest.raises(KekError, match="LEDGER_KEK"):
        LedgerProducer(no_kek)


def test_a_wrong_kek_stops_the_worker_producer_and_api_and_nothing_is_dead_lettered(kek_settings):
    results = publish(kek_settings, [asserted(GONE, "profile.city", "Oslo", 0, tenant=TENANT)])  # sealed with KEK A
    (record,) = read_topic(kek_settings)
    assert parse_envelope(orjson.loads(record.value)) is not None and b"Oslo" not in record.value
    other = kek_settings.model_copy(update={"kek": _kek()})  # KEK B under the same id ("default")

    code, log, _took = _exits(Worker(other))
    assert code != 0, log[-2000:]
    assert "KekError" in log and "is not the one" in log, log[-2000:]
    assert positions(kek_settings) == {}  # no position advanced
    assert _dead_letters(kek_settings) == 0
    assert read_topic(kek_settings, kek_settings.dlq_topic) == []
    with pytest.raises(KekError, match="is not the one"):
        LedgerProducer(other)

    from api.main import create_app

    with pytest.raises(KekError, match="is not the one"), TestClient(create_app(other)):
        pass

    # with the right KEK the same record applies: it was waiting, not lost
    with Worker(kek_settings) as worker:
        wait_for(lambda: positions(kek_settings).get(results[0].partition) == results[0].offset + 1, 90, 0.2)
        worker.check()
    with pg(kek_settings) as conn:
        assert _facts(conn, GONE) == 1
    assert _dead_letters(kek_settings) == 0


def test_encryption_off_without_a_kek_on_a_store_with_live_keys_stops_the_worker(kek_settings):
    publish(kek_settings, [asserted(GONE, "profile.city", "Oslo", 0, tenant=TENANT)])
    off = kek_settings.model_copy(update={"kek": None, "encryption": "off"})
    code, log, _took = _exits(Worker(off))
    assert code != 0, log[-2000:]
    assert "holds 1 data keys" in log and "LEDGER_KEK" in log, log[-2000:]
    assert positions(kek_settings) == {} and _dead_letters(kek_settings) == 0


KEK32 = base64.b64encode(b"k" * 32).decode()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "LEDGER_KEK is empty"),
        ("not base64 at all!", "'default' is not valid base64"),
        (base64.b64encode(b"x" * 16).decode(), "'default' is 16 bytes; AES-256 needs 32"),
        ('{"active": "k1", "keys": {"k0": "' + KEK32 + '"}}', "the active id 'k1' is not one of its keys ['k0']"),
        ('{"active": "k0", "keys": {}}', '"keys"'),
        ('{"active": "k0", "keys": {"k0": "' + KEK32 + '"', "LEDGER_KEK is not valid JSON"),
        ('{"active": "k0", "keys": {"k0": 7}}', "'k0' must be a base64 string"),
        ('{"active": "k0", "keys": {"k0": "' + base64.b64encode(b"y" * 31).decode() + '"}}', "'k0' is 31 bytes"),
    ],
)
def test_malformed_kek_text_names_its_problem(text, problem):
    with pytest.raises(KekError) as err:
        parse_keks(text, "LEDGER_KEK")
    assert problem in str(err.value)
    assert KEK32 not in str(err.value)  # never the key itself


@pytest.mark.unit
def test_kek_env_and_file_together_or_an_unreadable_file_are_refused(tmp_path):
    good = tmp_path / "kek"
    good.write_text(KEK32 + "\n")
    assert load_keks(None, good).ids() == frozenset({"default"})
    assert load_keks(None, None) is None
    with pytest.raises(KekError, match="set one of LEDGER_KEK and LEDGER_KEK_FILE, not both"):
        load_keks(KEK32, good)
    with pytest.raises(KekError, match=r"LEDGER_KEK_FILE '.*missing' cannot be read"):
        load_keks(None, tmp_path / "missing")
    with pytest.raises(KekError, match="cannot be read"):
        load_keks(None, tmp_path)  # a directory
    bad = tmp_path / "bad"
    bad.write_text("{not json")
    with pytest.raises(KekError, match=r"LEDGER_KEK_FILE '.*bad' is not valid JSON"):
        load_keks(None, bad)
    assert KEK32 not in repr(load_keks(KEK32, None))


# -- 3. a producer without database credentials ---------------------------------------------------------------------


def test_a_key_endpoint_refusing_one_tenant_refuses_only_its_events(enc):
    """The class: a batch's data keys were asked for in one call, so the key endpoint's 403 for one tenant (a key
    bound to others) failed every event of the batch, and as `unavailable`, a store to wait for. Asked tenant by
    tenant, the refused tenant's events are `refused` (a retry changes nothing) and the others are published; an
    endpoint away is `unavailable`, naming the API as the store that failed."""
    from producers.sdk import PublishError

    subject = f"user:kr-{uuid.uuid4().hex[:6]}"
    events = [
        asserted(subject, "profile.k1", "a", 1, tenant=TENANT, content="a"),
        asserted(subject, "profile.k1", "b", 1, tenant="globex", content="b"),
        asserted(subject, "profile.k2", "c", 2, tenant=TENANT, content="c"),
    ]
    with ApiServer(enc) as api:
        remote = enc.model_copy(update={"kek": None, "kek_file": None, "key_endpoint": api.url, "key_api_key": KEY})
        with LedgerProducer(remote) as producer:
            outcomes = producer.send_many(events)
    refused = outcomes[1]
    assert isinstance(refused, PublishError) and (refused.code, refused.store, refused.sent) == (
        "refused",
        "api",
        False,
    )
    assert "403" in refused.reason, refused.reason
    assert [type(o).__name__ for o in outcomes] == ["PublishResult", "PublishError", "PublishResult"], outcomes
    assert sorted(r.key for r in read_topic(enc)) == [f"{TENANT}|{subject}".encode()] * 2
    away = remote.model_copy(update={"key_endpoint": "http://127.0.0.1:1"})
    with LedgerProducer(away) as producer:
        outcomes = producer.send_many(events[:1])
    assert [(o.code, o.store) for o in outcomes] == [("unavailable", "api")], outcomes  # type: ignore[union-attr]


def test_a_producer_without_database_credentials_seals_with_keys_from_the_api(enc):
    markers = {s: f"{s.split(':')[1].upper()}-{os.urandom(4).hex()}" for s in (GONE, KEPT)}
    events = [
        asserted(s, f"profile.k{i}", {"secret": markers[s], "i": i}, i, tenant=TENANT, content=f"{markers[s]} {i}")
        for s in (GONE, KEPT)
        for i in range(2)
    ]
    with pipeline(enc, indexer=False) as pipe, ApiServer(enc) as api:
        remote = enc.model_copy(
            update={
                "kek": None,
                "kek_file": None,
                "pg_dsn": "postgresql://nobody:nothing@127.0.0.1:1/nowhere?connect_timeout=2",
                "key_endpoint": api.url,
                "key_api_key": KEY,
            }
        )
        with LedgerProducer(remote) as producer:
            assert isinstance(producer.keys.inner, RemoteKeys)  # type: ignore[union-attr]
            producer.publish_many(events)
            pipe.settle()
            with pg(enc) as conn:
                assert _facts(conn, GONE) == 2 and _facts(conn, KEPT) == 2
                contents = {r[0] for r in conn.execute("SELECT content FROM fact_versions").fetchall()}
                assert contents == {f"{markers[s]} {i}" for s in (GONE, KEPT) for i in range(2)}
                keys = {s: _keys_of(conn, enc, s) for s in (GONE, KEPT)}
            raw = read_topic(enc)
            assert len(raw) == 4
            for r in raw:
                assert not [m for m in markers.values() if m.encode() in r.value], r.value[:300]
                envelope = parse_envelope(orjson.loads(r.value))
                assert envelope is not None
                subject = GONE if r.key.endswith(GONE.encode()) else KEPT
                assert [k[0] for k in keys[subject]] == [envelope.key_id]

            # an erasure through the same producer retires the key through the API; the worker destroys it
            erased = producer.erase_subject(TENANT, GONE)
            pipe.settle()
        with pg(enc) as conn:
            assert _facts(conn, GONE) == 0
            assert _keys_of(conn, enc, GONE) == [(keys[GONE][0][0], False, True, erased.event_id)]
            assert _erasures_of(conn, enc, GONE) == [erased.event_id]

        url = f"{api.url}/v1/keys"
        ok = httpx.post(url, json={"tenant": TENANT, "subjects": [KEPT]}, headers={"X-API-Key": KEY}, timeout=30)
        assert ok.status_code == 200, ok.text
        assert ok.headers["cache-control"] == "no-store"
        assert [k["key_id"] for k in ok.json()["keys"]] == [keys[KEPT][0][0]]

        def refused(body, key=KEY, status=422):
            response = httpx.post(url, json=body, headers={"X-API-Key": key} if key else {}, timeout=30)
            assert response.status_code == status, response.text
            return response.json()["detail"]

        forbidden = refused({"tenant": "globex", "subjects": [KEPT]}, status=403)
        assert forbidden[0]["field"] == "tenant" and forbidden[0]["code"] == "forbidden_tenant"
        for key in ("not-a-key", None):
            unauthorized = refused({"tenant": TENANT, "subjects": [KEPT]}, key=key, status=401)
            assert unauthorized[0]["code"] == "unauthorized" and unauthorized[0]["field"] == "X-API-Key"
        assert refused({"tenant": TENANT, "subjects": []})[0]["field"] == "subjects"
        assert refused({"tenant": TENANT, "subjects": [f"user:{i}" for i in range(501)]})[0]["field"] == "subjects"
        assert refused({"tenant": TENANT, "subjects": [KEPT, "user:\x00nul"]})[0]["field"] == "subjects.1"
        assert refused({"subjects": [KEPT]})[0]["field"] == "tenant"
        retire = httpx.post(
            f"{api.url}/v1/keys/retire", json={"tenant": TENANT, "subject": KEPT}, headers={"X-API-Key": KEY}
        )
        assert retire.status_code == 422 and retire.json()["detail"][0]["field"] == "erasure_id", retire.text

    # an API without any KEK hands out no keys: 409, whatever it is asked
    from api.main import create_app

    without = enc.model_copy(update={"kek": None, "encryption": "off"})
    with TestClient(create_app(without)) as client:
        for path, body in (
            ("/v1/keys", {"tenant": TENANT, "subjects": [KEPT]}),
            ("/v1/keys/retire", {"tenant": TENANT, "subject": KEPT, "erasure_id": "e1"}),
        ):
            r = client.post(path, json=body, headers={"X-API-Key": KEY})
            assert r.status_code == 409, r.text
            assert r.json()["detail"][0]["code"] == "encryption_unavailable"


def test_a_write_that_needs_a_data_key_while_postgres_is_away_names_postgres(enc):
    """The broker is up and PostgreSQL (the key store's database) is not: a write that must be sealed is refused
    with the 503 naming postgres, never kafka (a one-event door, MCP's, raises the same item: writes.publish_one)."""
    from api.main import create_app

    away = enc.model_copy(update={"pg_dsn": "postgresql://nobody:nothing@127.0.0.1:1/nowhere?connect_timeout=2"})
    event = {"type": "memory.asserted", "tenant": TENANT, "subject": f"user:away-{uuid.uuid4().hex[:6]}",
             "key": "k", "value": 1, "content": "c", "event_id": uuid.uuid4().hex}  # fmt: skip
    with TestClient(create_app(away)) as client:
        r = client.post("/v1/events", json={"events": [event]}, headers={"X-API-Key": KEY})
        assert r.status_code == 503, r.text
        (item,) = r.json()["detail"]
        assert item["code"] == "store_unavailable" and item["message"].startswith("postgres: "), item
        assert r.json()["results"][0]["error"]["message"].startswith("no data key"), r.text


def test_an_erasure_whose_key_cannot_be_retired_is_refused_naming_the_store_and_nothing_is_published(enc):
    """The key store's database away: an erasure through each door (HTTP, the SDK with the store, the SDK with the
    API's key endpoint) is refused naming the store that failed, and nothing of it reaches the log. Sent, it would
    have the worker destroy the subject's live key, which other processes may still seal its next events with
    (records nobody could open then); refused, the caller retries once the store answers."""
    from api.main import create_app
    from producers.sdk import PublishError

    dead_pg = "postgresql://nobody:nothing@127.0.0.1:1/nowhere?connect_timeout=2"
    subject = f"user:erase-away-{uuid.uuid4().hex[:6]}"
    with LedgerProducer(enc) as producer:  # the subject has a live key and a record in the log
        producer.publish(asserted(subject, "profile.name", "Ann", 1, tenant=TENANT, content="Ann"))
    away = enc.model_copy(update={"pg_dsn": dead_pg})
    with TestClient(create_app(away)) as client:
        r = client.delete(f"/v1/subjects/{subject}", params={"tenant": TENANT}, headers={"X-API-Key": KEY})
        assert r.status_code == 503, r.text
        (item,) = r.json()["detail"]
        assert item["code"] == "store_unavailable" and item["message"].startswith("postgres: "), item
    remote = away.model_copy(
        update={"kek": None, "kek_file": None, "key_endpoint": "http://127.0.0.1:1", "key_api_key": KEY}
    )
    for settings, store in ((away, "postgres"), (remote, "api")):
        with LedgerProducer(settings) as producer, pytest.raises(PublishError) as refused:
            producer.erase_subject(TENANT, subject)
        assert (refused.value.code, refused.value.store) == ("unavailable", store), refused.value
        assert "not retired" in refused.value.reason, refused.value.reason

    def types() -> list[str]:
        of_subject = [r for r in read_topic(enc) if r.key.endswith(subject.encode())]
        return sorted(orjson.loads(r.value).get("type", "sealed") for r in of_subject)

    assert types() == ["memory.asserted"]
    with LedgerProducer(enc) as producer:  # the store answers again: the same erasure goes through
        producer.erase_subject(TENANT, subject)
    assert types() == ["memory.asserted", "subject.erased"]


def test_the_key_store_replaces_a_connection_the_server_ended(enc):
    """A producer's key store holds one connection: when the server ends it (a restart, an administrator), the next
    call replaces it and answers, instead of failing once per process after every PostgreSQL restart."""
    from producers.keys.store import KeyStore, ensure_key_schema

    with psycopg.connect(enc.pg_dsn, autocommit=True) as admin:
        ensure_key_schema(admin, enc.keys_schema)
        store = KeyStore(enc.pg_dsn, enc.keys_schema, load_keks(enc.kek.get_secret_value(), None))
        try:
            first = store.sealing_keys([(TENANT, KEPT)])[(TENANT, KEPT)]
            for _ in range(2):  # ended between two calls, twice: each next call answers with the same key
                pid = store._conn.info.backend_pid  # type: ignore[union-attr]
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                assert store.sealing_keys([(TENANT, KEPT)])[(TENANT, KEPT)] == first
            admin.execute("SELECT pg_terminate_backend(%s)", (store._conn.info.backend_pid,))  # type: ignore[union-attr]
            assert store.retire(TENANT, KEPT, "erasure-1") == 1
        finally:
            store.close()
            cleanup(enc)


def test_one_producers_write_and_erasure_of_a_subject_at_once_never_seal_with_the_destroyed_key(enc):
    """One process (a door) writes a subject's event from one thread while another erases the subject: the event is
    either in the log before the erasure (sealed with the key it destroys: the erased past) or after it, sealed with
    the next key and applied; never after it sealed with the destroyed key (a `key_destroyed` letter for an event
    the door had acknowledged). The write is held between its sealing and its hand-over to the broker, where the
    erasure, unordered, slipped in between."""
    import threading

    with pipeline(enc, indexer=False) as pipe, LedgerProducer(enc) as producer:
        subject = "user:race"
        producer.publish(asserted(subject, "k.first", 0, 0, tenant=TENANT, content="first"))
        sealed = threading.Event()
        append = producer._append

        def held_append(prepared):  # the write's records are sealed: the erasure starts now
            if any(item[5] is not None and item[5].type.value == "memory.asserted" for item in prepared):
                sealed.set()
                time.sleep(0.5)
            return append(prepared)

        producer._append = held_append  # type: ignore[method-assign]
        write = threading.Thread(
            target=lambda: producer.publish(asserted(subject, "k.race", 1, 0, tenant=TENANT, content="race"))
        )
        write.start()
        assert sealed.wait(30)
        erased = producer.erase_subject(TENANT, subject)
        write.join()
        pipe.settle()
        with pg(enc) as conn:
            letters = conn.execute('SELECT code, "partition", "offset" FROM dead_letters').fetchall()
            applied = conn.execute("SELECT count(*) FROM events WHERE subject = %s", (subject,)).fetchone()[0]
    assert letters == [], letters
    assert applied == 1 and erased.offset is not None  # the erasure alone: the write was the erased past

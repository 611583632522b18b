"""Rotating the key-encryption key, against the real servers: keys rewrapped, the log left as it was.

The ring starts as {"active": "k1", "keys": {"k1"}}; sealed events of several subjects are published and
projected. Then k2 is added and made active, and `ledger keys rotate` (the real command, as a child process)
rewraps every data key under k2. From then on a worker, the API and an SDK configured with ONLY k2 start and
work: the old records open, their facts are readable, new events apply, and a rebuild from offset 0 gives the
live checksum; a worker with only k1 refuses to start. The topic's bytes are the same before and after.

A second test rotates while producers keep creating data keys (one still on the old active id, one on the
new): rotate's `FOR UPDATE SKIP LOCKED` batches and the producers' inserts interleave, and no key is lost,
duplicated or changed; a second rotate picks up what the first could not see.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time

import orjson
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from api.main import create_app
from producers.keys.envelope import parse_envelope
from producers.keys.kek import parse_keks
from producers.keys.store import KeyStore, key_states
from producers.records import decode_record, open_record
from producers.sdk import LedgerProducer
from producers.settings import REPO_ROOT, Settings, get_settings
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.support import Worker, asserted, cleanup, pg, pipeline, read_topic, wait_for

KEY = "rot-key"
TENANT = "acme"
SUBJECTS = [f"user:rot-{i}" for i in range(4)]


def _b64() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def _ring(active: str, **keys: str) -> SecretStr:
    return SecretStr(orjson.dumps({"active": active, "keys": keys}).decode())


def _with(settings: Settings, kek: SecretStr) -> Settings:
    return settings.model_copy(update={"kek": kek})


def _ledger(settings: Settings, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`ledger <args>` as an operator runs it, on `settings` (stdout and stderr as text)."""
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args],
        cwd=REPO_ROOT,
        env=settings.child_environ(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _facts(client: TestClient, subject: str) -> list[str]:
    r = client.get(f"/v1/subjects/{subject}/facts", params={"tenant": TENANT}, headers={"X-API-Key": KEY})
    assert r.status_code == 200, r.text
    return sorted(f["content"] for f in r.json()["facts"])


def _opened(settings: Settings, records: list) -> list:
    """Every sealed record of `records` opened with the data keys `settings`' KEKs unwrap (its events)."""
    keks = parse_keks(settings.kek.get_secret_value(), "test")
    kids = {parse_envelope(orjson.loads(r.value)).key_id for r in records}
    with pg(settings) as conn, conn.cursor() as cur:
        states = key_states(cur, settings.keys_schema, keks, kids)
    events = []
    for r in records:
        incoming = decode_record(r.topic, r.partition, r.offset, r.value, timestamp_ms=r.timestamp)
        opened = open_record(incoming, states[incoming.key_id].key)
        assert opened.event is not None, opened.error
        events.append(opened.event)
    return events


def test_rotation_rewraps_the_keys_and_leaves_the_log_as_it_was(base_settings):
    k1, k2 = _b64(), _b64()
    old = base_settings.private(unique("rot"), encryption="on", kek=_ring("k1", k1=k1), api_keys={KEY: [TENANT]})
    during = _with(old, _ring("k2", k1=k1, k2=k2))  # step 1 of a rotation: k2 added and active everywhere
    new = _with(old, _ring("k2", k2=k2))  # after `ledger keys rotate`: k1 has left the configuration
    only_k1 = _with(old, _ring("k1", k1=k1))
    seed = [
        asserted(s, f"profile.k{j}", f"{s}-v{j}", j, tenant=TENANT, content=f"{s} fact {j}")
        for s in SUBJECTS
        for j in range(2)
    ]
    with pipeline(old, seed=seed, indexer=False) as pipe:
        before = read_topic(old)
        assert len(before) == len(seed)
        assert all(parse_envelope(orjson.loads(r.value)) is not None for r in before)  # sealed on the wire
        assert {e.content for e in _opened(old, before)} == {e.content for e in seed}
        pipe.worker.stop()

        # k2 alone cannot open what k1 wrapped yet: the check says so, naming k1, and exits 1
        refused = _ledger(new, "keys", "status")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "'k1'" in refused.stderr and f"({len(SUBJECTS)} keys)" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr and k1 not in refused.stdout + refused.stderr

        rotated = _ledger(during, "keys", "rotate")
        assert rotated.returncode == 0, rotated.stdout + rotated.stderr
        assert f"rewrapped {len(SUBJECTS)} data keys under 'k2'" in rotated.stdout, rotated.stdout
        assert "may leave the configuration): k1" in rotated.stdout, rotated.stdout
        again = _ledger(during, "keys", "rotate", "--quiet")  # idempotent: nothing left to rewrap
        assert again.returncode == 0 and "rewrapped 0 data keys" in again.stdout, again.stdout + again.stderr

        status = _ledger(new, "keys", "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"live data keys: {len(SUBJECTS)} (by key-encryption key: 'k2': {len(SUBJECTS)})" in status.stdout
        assert "fit the key store" in status.stdout and k2 not in status.stdout + status.stderr

        # only k2 from here on: the log was not rewritten, its old records open, the worker and the API start
        after = read_topic(new)
        assert [(r.partition, r.offset, r.value) for r in after] == [(r.partition, r.offset, r.value) for r in before]
        assert {e.content for e in _opened(new, after)} == {e.content for e in seed}

        pipe.worker = Worker(new).start()
        with LedgerProducer(new) as producer:  # the SDK starts with k2 alone and seals the new events
            producer.publish_many(
                [asserted(s, "profile.k0", f"{s}-later", 5, tenant=TENANT, content=f"{s} later") for s in SUBJECTS]
                + [asserted("user:rot-new", "profile.k0", "fresh", 5, tenant=TENANT, content="a new subject")]
            )
        pipe.caught_up()
        with TestClient(create_app(new)) as client:  # the API starts with k2 alone and reads the facts
            for s in SUBJECTS:
                assert _facts(client, s) == sorted([f"{s} later", f"{s} fact 1"])
            assert _facts(client, "user:rot-new") == ["a new subject"]
        old_at = {(r.partition, r.offset) for r in before}
        newer = [r for r in read_topic(new) if (r.partition, r.offset) not in old_at]
        assert len(newer) == len(SUBJECTS) + 1
        assert {e.content for e in _opened(new, newer)} == {f"{s} later" for s in SUBJECTS} | {"a new subject"}

        pipe.worker.stop()
        report = rebuild(new, keep_old=False)
        assert report.records == len(seed) + len(SUBJECTS) + 1
        assert report.live_checksum == report.rebuilt_checksum

        # the old configuration now fails loudly at start instead of per record
        stale = Worker(only_k1).start()
        try:
            wait_for(lambda: not stale.alive(), 90, 0.5, "the worker with only k1 to refuse to start")
        finally:
            stale.kill()
        assert stale.proc.returncode != 0
        assert "not configured" in stale.log() and "'k2'" in stale.log(), stale.log()[-2000:]


@pytest.mark.unit
def test_new_kek_prints_a_key_or_a_ring_that_parses():
    from typer.testing import CliRunner

    from infra.cli import app

    runner = CliRunner()
    bare = runner.invoke(app, ["keys", "new-kek"])
    assert bare.exit_code == 0, bare.output
    key = bare.stdout.strip()
    assert len(base64.b64decode(key, validate=True)) == 32
    assert parse_keks(key, "bare").ids() == {"default"}
    ring = runner.invoke(app, ["keys", "new-kek", "--id", "k3"])
    assert ring.exit_code == 0, ring.output
    keks = parse_keks(ring.stdout.strip(), "ring")
    assert keks.active_id == "k3" and keks.ids() == {"k3"}
    assert runner.invoke(app, ["keys", "new-kek"]).stdout.strip() != key  # fresh each time


@pytest.mark.unit
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no key-encryption key is configured"),
        ({"LEDGER_KEK": "not-base64!"}, "is not valid base64"),
        ({"LEDGER_KEK": '{"active": "k9", "keys": {"k1": "' + "A" * 43 + '="}}'}, "the active id 'k9'"),
    ],
)
def test_rotate_without_a_usable_kek_is_one_line_and_exit_1(env, message):
    """Refused before any server is asked: the configuration alone is wrong."""
    from typer.testing import CliRunner

    from infra.cli import app

    get_settings.cache_clear()  # the command reads the process's settings once: read them with this environment
    try:
        result = CliRunner().invoke(app, ["keys", "rotate"], env={"LEDGER_KEK": None, "LEDGER_KEK_FILE": None, **env})
    finally:
        get_settings.cache_clear()  # and not leave them to the next test
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output  # one line, no traceback


@pytest.fixture
def ring(base_settings):
    k1, k2 = _b64(), _b64()
    s = base_settings.private(unique("rotc"), encryption="on", kek=_ring("k1", k1=k1))
    yield s, _ring("k1", k1=k1, k2=k2), _ring("k2", k1=k1, k2=k2), _ring("k2", k2=k2)
    cleanup(s)


def test_rotation_beside_producers_creating_keys_loses_nothing(ring):
    settings, lagging_ring, active_ring, k2_only = ring
    keks = {name: parse_keks(r.get_secret_value(), name) for name, r in (("lag", lagging_ring), ("new", active_ring))}
    handed: dict[tuple[str, str], tuple[str, bytes]] = {}  # (tenant, subject) -> (key id, key) a producer got
    lock = threading.Lock()

    def store(k) -> KeyStore:
        return KeyStore(settings.pg_dsn, settings.keys_schema, k)

    def remember(got) -> None:
        with lock:
            for pair, key in got.items():
                assert handed.setdefault(pair, (key.key_id, key.key)) == (key.key_id, key.key), pair

    first = store(keks["lag"])  # 1,500 keys under k1 before the rotation starts
    try:
        for start in range(0, 1500, 250):
            remember(first.sealing_keys((TENANT, f"user:pre-{i}") for i in range(start, start + 250)))
    finally:
        first.close()

    stop = threading.Event()
    errors: list[BaseException] = []

    def produce(name: str, pause: float) -> None:  # fresh subjects in small batches, and known ones, until told
        s = store(keks[name])
        try:
            i = 0
            while not stop.wait(pause):
                fresh = [(TENANT, f"user:{name}-{i + j}") for j in range(10)]
                seen = [(TENANT, f"user:pre-{(i * 7 + j) % 1500}") for j in range(10)]
                remember(s.sealing_keys(fresh + seen))
                i += 10
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, which fails with it
            errors.append(exc)
        finally:
            s.close()

    # the lagging producer is paced: rotate ends when one of its batches finds nothing left under another KEK
    threads = [threading.Thread(target=produce, args=a, daemon=True) for a in (("lag", 0.02), ("new", 0.0))]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        rotated = _ledger(_with(settings, active_ring), "keys", "rotate", "--batch-size", "50", "--quiet")
        time.sleep(0.5)  # the lagging producer keeps wrapping new keys under k1 after the rotation ended
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    first_done = int(rotated.stdout.split("rewrapped ")[1].split()[0])
    assert first_done > 1500, rotated.stdout  # the pre-existing keys and some the lagging producer made meanwhile
    lagging = sum(1 for (_, s) in handed if s.startswith("user:lag-"))
    assert lagging > 0 and sum(1 for (_, s) in handed if s.startswith("user:new-")) > 0

    # every producer has k2 active now: a second rotation takes what the lagging one wrapped under k1
    second = _ledger(_with(settings, active_ring), "keys", "rotate", "--quiet")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "may leave the configuration): k1" in second.stdout, second.stdout

    only_k2 = parse_keks(k2_only.get_secret_value(), "k2 only")
    with pg(settings) as conn, conn.cursor() as cur:
        cur.execute(
            f'SELECT key_id, tenant, kek_id, destroyed_at IS NULL FROM "{settings.keys_schema}".data_keys'  # noqa: S608 - test's own private schema name
        )
        rows = cur.fetchall()
        assert len(rows) == len(handed), "a data key was created twice or lost"
        assert {r[2] for r in rows} == {"k2"} and all(r[3] for r in rows)
        states = key_states(cur, settings.keys_schema, only_k2, [r[0] for r in rows])
    assert {(t, kid, key) for (t, _), (kid, key) in handed.items()} == {
        (st.tenant, st.key_id, st.key) for st in states.values()
    }
    assert all(states[kid].owns(t, s) for (t, s), (kid, _) in handed.items())  # under the rotated digest keys
    # each key ever wrapped by k1 (the 1,500 and the lagging producer's) was rewrapped exactly once
    assert first_done + int(second.stdout.split("rewrapped ")[1].split()[0]) == 1500 + lagging

"""The local service stack runs sealed by default, and a deployment that publishes clear text says so at start.

The services' settings are built the way `python -m infra up --service` (so `make demo`) builds them: the
environment infra gives each child (`infra.service._env`), read back by `Settings()` as the child reads it. With
nothing configured, encryption is on with a local key-encryption key file of mode 0600 in the data folder, created
once; an explicit `LEDGER_ENCRYPTION=off` and a configured KEK are kept. End to end: the demo's facts posted to
an API running with those settings reach a private topic where a plain kafka-python consumer finds no value, content,
alias, entity or reference of theirs in the raw bytes. Last: encryption off outside development is a WARNING at the
start of the API and of the worker, naming the setting.
"""

from __future__ import annotations

import logging
import os
import stat

import orjson
import psycopg
import pytest

from api.demo import FACTS, _event
from infra import service
from producers.keys.kek import load_keks
from producers.keys.store import key_context
from producers.settings import Settings
from tests.conftest import unique
from tests.support import pipeline, read_topic

TENANT = "demo"


def _child_settings(s: Settings, name: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings the service `name` reads from the environment infra starts it with."""
    for var in [v for v in os.environ if v.startswith("LEDGER_")]:
        monkeypatch.delenv(var)
    for var, value in service._env(s, name, name).items():
        monkeypatch.setenv(var, value)
    return Settings()


@pytest.fixture
def local(tmp_path, monkeypatch) -> Settings:
    """The developer's settings, nothing about encryption configured, data in a folder of the test's own."""
    for var in ("LEDGER_ENCRYPTION", "LEDGER_KEK", "LEDGER_KEK_FILE"):
        monkeypatch.delenv(var, raising=False)
    return Settings(development=True, data_dir=tmp_path / "data")


def test_every_service_is_configured_sealed_with_a_private_local_kek(local, monkeypatch):
    children = {name: _child_settings(local, name, monkeypatch) for name in service.SERVICES}
    for name, child in children.items():
        assert child.encryption == "on", name
        assert child.kek_file == local.data_dir / "kek", name
    kek_file = local.data_dir / "kek"
    assert stat.S_IMODE(kek_file.stat().st_mode) == 0o600
    assert load_keks(None, kek_file) is not None  # a usable key
    first = kek_file.read_bytes()

    kek_file.chmod(0o644)  # created once, never replaced; kept private whatever touched it
    again = _child_settings(local, "api", monkeypatch)
    assert again.kek_file == kek_file and kek_file.read_bytes() == first
    assert stat.S_IMODE(kek_file.stat().st_mode) == 0o600

    # off stays possible, said explicitly; a configured KEK is the one used (no local file in its place)
    explicit_off = _child_settings(local.model_copy(update={"encryption": "off"}), "worker", monkeypatch)
    assert explicit_off.encryption == "off" and explicit_off.kek_file == kek_file
    own = local.data_dir / "elsewhere.kek"
    own.write_text(first.decode())
    configured = _child_settings(local.model_copy(update={"kek_file": own}), "worker", monkeypatch)
    assert configured.encryption == "on" and configured.kek_file == own


def test_the_demo_facts_reach_the_topic_sealed(local, monkeypatch):
    settings = _child_settings(local, "api", monkeypatch).private(unique("seal"), api_keys={"seal-key": [TENANT]})
    with pipeline(settings, worker=False, indexer=False, app=True) as pipe:
        events = [_event(TENANT, fact) for fact in FACTS]
        r = pipe.client.post("/v1/events", json={"events": events}, headers={"X-API-Key": "seal-key"})
        assert r.status_code in (200, 202), r.text
        assert all(x["accepted"] for x in r.json()["results"]), r.text
        raw = read_topic(settings)
    assert len(raw) == len(FACTS)
    markers = {"demo-session-1"}
    for fact in FACTS:
        said = {
            fact["content"],
            *fact.get("aliases", []),
            *fact.get("entities", []),
            orjson.dumps(fact["value"]).decode(),
        }
        markers |= {m for m in said if m not in f"{fact['subject']} {fact['key']}"}  # those two stay clear (routing)
    for record in raw:
        found = [m for m in markers if m.encode() in record.value]
        assert not found, (found, record.value[:300])
        assert b'"sealed"' in record.value


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "LEDGER_ENCRYPTION" in r.getMessage()
    ]


def test_encryption_off_outside_development_is_said_at_start(base_settings, caplog):
    clear = base_settings.private(unique("loud"), encryption="off", kek=None, kek_file=None)
    deployment = clear.model_copy(update={"development": False})
    caplog.set_level(logging.WARNING)
    with psycopg.connect(deployment.pg_dsn, autocommit=True) as conn:  # what the worker does at start
        key_context(deployment, conn)
        assert len(_warnings(caplog)) == 1, caplog.text
        caplog.clear()
        key_context(clear, conn)  # a development machine: its data is the demo's
        assert _warnings(caplog) == []
        conn.execute(f'DROP SCHEMA IF EXISTS "{deployment.keys_schema}" CASCADE')
    with pipeline(deployment, worker=False, indexer=False, app=True):  # the API's start
        pass
    said = _warnings(caplog)
    assert len(said) == 1 and "clear text" in said[0] and deployment.topic in said[0], said

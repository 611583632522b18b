"""Kafka with credentials: a broker of its own with a SASL_PLAINTEXT (PLAIN) listener, reached only through settings;
and one with SASL_SSL, its certificate signed by a CA made here.

The shared broker on 9092 is left alone: `infra.kafka_cluster` starts one more node on free ports, with two users
(`sasl_users`; `tls` for the second), data under `.data/kafka-cluster/`. Every client is built from the settings by
`producers.kafka_producer.kafka_connection` (the SDK's producer, the topics' admin, the readers) and the worker's faust
app from the same settings (`stream_processors.app.broker_credentials`). Shown here: the SDK publishes and a consumer
built by the one function reads it back; the worker applies an event; a wrong password is refused at once with
Kafka's own reason, a client without credentials gives up within its timeout; the password is in no log line, repr,
dump, error or command output, and only `as_env` (what a child process needs) carries it.

The test modules here may not restart the shared servers (tests/faults/ do): this one starts and stops only its
own broker, so it runs with the others.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import certifi
import faust
import kafka.errors as Errors
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from pydantic import SecretStr, ValidationError

from infra.kafka_cluster import KafkaCluster
from infra.private import free_ports
from producers.contract import decode
from producers.kafka_producer import kafka_connection
from producers.logs import logging_config
from producers.sdk import LedgerProducer, PublishError
from producers.settings import Settings, settings_problem
from producers.topics import end_offsets, probe
from stream_processors.app import broker_credentials
from tests.conftest import unique
from tests.support import Worker, cleanup, pg, wait_for
from tests.support.tls import make_pki
from tests.test_cli_settings_errors import run, user_env

ADMIN_PASSWORD = "adm-" + secrets.token_hex(8)
PASSWORD = "pw-" + secrets.token_hex(12)  # unique: found in a text only if the text leaked it
WRONG = "wrong-" + secrets.token_hex(12)
TENANT = "acme"


@contextlib.contextmanager
def _broker(base_settings: Settings, tls: bool) -> Iterator[KafkaCluster]:
    """One KRaft node whose clients' listener asks for a SASL PLAIN login (over TLS with `tls`); stopped and removed
    afterwards."""
    ports = free_ports(2)
    base = base_settings.data_dir / "kafka-cluster" / unique("auth")
    users = {"admin": ADMIN_PASSWORD, "ledger": PASSWORD}
    pki = make_pki(base / "pki") if tls else None
    keys = (pki.keystore, pki.ca) if pki else None
    with KafkaCluster(base_settings, base, [(ports[0], ports[1])], sasl_users=users, tls=keys) as broker:  # and remove
        yield broker
    with contextlib.suppress(OSError):
        base.parent.rmdir()  # .data/kafka-cluster/, when no other cluster is in it


@pytest.fixture(scope="module")
def sasl_broker(base_settings: Settings) -> Iterator[KafkaCluster]:
    with _broker(base_settings, tls=False) as broker:
        yield broker


@pytest.fixture
def on_sasl(base_settings: Settings, sasl_broker: KafkaCluster) -> Iterator[Settings]:
    """Private names on the SASL broker as the user `ledger` (PostgreSQL: the shared server)."""
    settings = sasl_broker.client_settings(base_settings.private(unique("sasl")), "ledger")
    try:
        yield settings
    finally:
        cleanup(settings)


def _wrong(settings: Settings) -> Settings:
    return settings.model_copy(update={"kafka_sasl_password": SecretStr(WRONG)})


def _read_back(settings: Settings, partition: int, offset: int) -> bytes:
    consumer = KafkaConsumer(**kafka_connection(settings), group_id=None, enable_auto_commit=False)
    try:
        tp = TopicPartition(settings.topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                return records[0].value
        raise AssertionError(f"nothing read at {partition}/{offset}")
    finally:
        consumer.close()


def test_the_sdk_publishes_and_a_consumer_of_the_one_config_reads(on_sasl: Settings, caplog) -> None:
    caplog.set_level(logging.INFO)  # kafka-python's own lines too (at INFO: producers.logs keeps them there)
    with LedgerProducer(on_sasl, timeout_s=20) as producer:
        result = producer.assert_fact(TENANT, "user:1", "profile.city", "Lyon", "user 1 lives in Lyon")
    event = decode(_read_back(on_sasl, result.partition, result.offset))
    assert (event.event_id, event.value) == (result.event_id, "Lyon")
    assert end_offsets(on_sasl, timeout_s=10)[result.partition] == result.offset + 1
    assert probe(on_sasl)
    assert "Authenticated as ledger" in caplog.text and PASSWORD not in caplog.text  # the login, not its password


def test_a_wrong_password_is_refused_at_once_with_the_brokers_reason(on_sasl: Settings, caplog) -> None:
    caplog.set_level(logging.INFO)
    bad = _wrong(on_sasl)
    t0 = time.monotonic()
    with pytest.raises(PublishError) as refused, LedgerProducer(bad, timeout_s=20) as producer:
        producer.assert_fact(TENANT, "user:1", "profile.city", "Paris", "user 1 lives in Paris")
    took = time.monotonic() - t0
    assert refused.value.code == "unavailable"
    assert "SaslAuthenticationFailedError" in refused.value.reason
    assert "Invalid username or password" in refused.value.reason
    assert took < 5, f"a refused login took {took:.1f}s: retried until the timeout (20 s) instead of failing"
    with pytest.raises(Errors.SaslAuthenticationFailedError):
        KafkaConsumer(**kafka_connection(bad), group_id=None, bootstrap_timeout_ms=20_000)
    assert not probe(bad, timeout=3)
    assert WRONG not in str(refused.value) and WRONG not in caplog.text and PASSWORD not in caplog.text


def test_a_client_without_credentials_gives_up_within_its_timeout(on_sasl: Settings) -> None:
    """The broker cannot tell a plaintext client why (it does not speak SASL): bounded by the timeout, not a hang."""
    plain = on_sasl.model_copy(
        update={"kafka_security_protocol": "PLAINTEXT", "kafka_sasl_username": None, "kafka_sasl_password": None}
    )
    t0 = time.monotonic()
    with pytest.raises(PublishError) as refused, LedgerProducer(plain, timeout_s=2) as producer:
        producer.connect()
    assert refused.value.code == "unavailable" and time.monotonic() - t0 < 10


def _worker_applies(settings: Settings, **env: str) -> str:
    """Publish one event with the SDK, run the real worker until PostgreSQL has it; the worker's log."""
    with LedgerProducer(settings, timeout_s=20) as producer:
        result = producer.assert_fact(TENANT, "user:2", "profile.city", "Nantes", "user 2 lives in Nantes")
    with Worker(settings, **env) as worker:

        def applied() -> bool:
            worker.check()
            with contextlib.suppress(Exception), pg(settings) as conn:
                row = conn.execute("SELECT count(*) FROM events WHERE event_id = %s", (result.event_id,)).fetchone()
                return row[0] == 1
            return False

        wait_for(applied, timeout=90, what="the worker applied the event")
        return worker.log()


def test_the_worker_applies_an_event_over_sasl(on_sasl: Settings) -> None:
    log = _worker_applies(on_sasl, log_level="DEBUG")  # producers.logs keeps the Kafka clients at INFO
    assert "Authenticated as ledger via PLAIN" in log and " DEBUG " in log and PASSWORD not in log


def test_over_sasl_ssl_the_clients_and_the_worker_check_the_brokers_certificate(base_settings: Settings) -> None:
    """SASL_SSL, as managed offerings ask: the SDK, the readers and the worker (faust's SASLCredentials with the
    same TLS context) connect with the CA file; a CA that did not sign the broker's certificate is refused."""
    with _broker(base_settings, tls=True) as broker:
        settings = broker.client_settings(base_settings.private(unique("tls")), "ledger")
        assert settings.kafka_security_protocol == "SASL_SSL" and settings.kafka_ssl_cafile is not None
        try:
            log = _worker_applies(settings)
            assert "Authenticated as ledger via PLAIN" in log and PASSWORD not in log
            assert probe(settings)
            other_ca = settings.model_copy(update={"kafka_ssl_cafile": make_pki(broker.base_dir / "other").ca})
            t0 = time.monotonic()
            with pytest.raises(PublishError) as refused, LedgerProducer(other_ca, timeout_s=3) as producer:
                producer.connect()
            assert refused.value.code == "unavailable" and time.monotonic() - t0 < 10
        finally:
            cleanup(settings)


def test_a_worker_with_a_wrong_password_stops_before_it_joins_naming_the_login(on_sasl: Settings) -> None:
    bad = _wrong(on_sasl)
    with Worker(bad) as worker:
        wait_for(lambda: not worker.alive(), timeout=60, what="the worker stopped")
        log = worker.log()
    assert worker.proc is not None and worker.proc.returncode != 0
    assert "SaslAuthenticationFailedError" in log and WRONG not in log and PASSWORD not in log


def test_the_topics_command_on_the_sasl_broker(on_sasl: Settings) -> None:
    """`ledger topics` as a user runs it, on LEDGER_KAFKA_*: creates the topics with the right password; with a wrong
    one, one line saying Kafka refused the login (exit 3, no traceback); neither password printed."""
    good = run(("topics",), user_env(**on_sasl.as_env()))
    assert good.returncode == 0, good.stderr[-2000:]
    assert on_sasl.topic in good.stdout
    bad = run(("topics",), user_env(**_wrong(on_sasl).as_env()))
    assert bad.returncode == 3 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    assert "refused the login" in bad.stderr and "LEDGER_KAFKA_SASL_PASSWORD" in bad.stderr
    # `python -m infra status` of an external Kafka (a deployment's check) logs in as the clients do
    status = [sys.executable, "-m", "infra", "status", "kafka"]
    up, down = (
        subprocess.run(status, env=user_env(**s.as_env(managed=["model"])), capture_output=True, text=True, timeout=60)
        for s in (on_sasl, _wrong(on_sasl))
    )
    assert up.returncode == 0 and "healthy" in up.stdout, up.stdout + up.stderr
    assert down.returncode == 3 and "down" in down.stdout, down.stdout + down.stderr
    for out in (good.stdout, good.stderr, bad.stdout, bad.stderr, up.stdout, up.stderr, down.stdout, down.stderr):
        assert PASSWORD not in out and WRONG not in out


# -- the settings, no server ----------------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_password_is_a_secret_everywhere_but_a_childs_environment(base_settings: Settings, monkeypatch) -> None:
    s = base_settings.model_copy(
        update={
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_username": "ledger",
            "kafka_sasl_password": SecretStr(PASSWORD),
        }
    )
    for text in (repr(s), str(s), s.model_dump_json(), repr(s.model_dump()), repr(broker_credentials(s))):
        assert PASSWORD not in text
    env = s.as_env()
    assert env["LEDGER_KAFKA_SASL_PASSWORD"] == PASSWORD  # a worker started by infra or a test logs in too
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = Settings()  # what the child reads
    assert child.kafka_sasl_password is not None and child.kafka_sasl_password.get_secret_value() == PASSWORD


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "LEDGER_KAFKA_SASL_USERNAME and LEDGER_KAFKA_SASL_PASSWORD"),
        ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_username": "u"}, "LEDGER_KAFKA_SASL_PASSWORD"),
        ({"kafka_sasl_username": "u", "kafka_sasl_password": PASSWORD}, "sends no credentials"),
        ({"kafka_ssl_cafile": "/etc/ca.pem"}, "does not use TLS"),
        ({"kafka_security_protocol": "SSL", "kafka_ssl_keyfile": "/k.pem"}, "LEDGER_KAFKA_SSL_CERTFILE"),
        ({"kafka_security_protocol": "TLS"}, "LEDGER_KAFKA_SECURITY_PROTOCOL"),
        (
            {
                "kafka_security_protocol": "SASL_SSL",
                "kafka_sasl_username": "u",
                "kafka_sasl_password": PASSWORD + "\x00",
            },
            "NUL",
        ),
        ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "GSSAPI"}, "LEDGER_KAFKA_SASL_MECHANISM"),
    ],
)
def test_settings_that_cannot_connect_are_refused_naming_the_variable(fields: dict, names: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(development=True, **fields)
    problem = settings_problem(refused.value)
    assert problem is not None and names in problem and PASSWORD not in problem
    assert PASSWORD[-6:] not in str(refused.value)  # a traceback of it (a server's start) quotes no part of it either


@pytest.mark.unit
def test_a_refusals_text_quotes_no_input() -> None:
    """pydantic quotes the input (every setting read) in an error's text, shortened to its first and last ~24
    characters: a password or DSN may be among them. A server that fails to start prints that text."""
    with pytest.raises(ValidationError) as refused:
        Settings(development=True, kafka_sasl_username="u", kafka_sasl_password="hunter2")
    text = str(refused.value)
    assert "input_value" not in text and "hunter2" not in text and "LEDGER_KAFKA_SECURITY_PROTOCOL" in text


@pytest.mark.unit
def test_one_config_for_kafka_python_and_faust(base_settings: Settings) -> None:
    assert kafka_connection(base_settings) == {
        "bootstrap_servers": base_settings.kafka_bootstrap,
        "security_protocol": "PLAINTEXT",
    }
    assert broker_credentials(base_settings) is None
    scram = base_settings.model_copy(
        update={
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "SCRAM-SHA-512",
            "kafka_sasl_username": "ledger",
            "kafka_sasl_password": SecretStr(PASSWORD),
            "kafka_ssl_cafile": certifi.where(),
        }
    )
    config = kafka_connection(scram)
    assert config["sasl_mechanism"] == "SCRAM-SHA-512" and config["sasl_plain_password"] == PASSWORD
    context = config["ssl_context"]
    assert context.check_hostname and context.verify_mode.name == "CERT_REQUIRED" and context.get_ca_certs()
    for client in (KafkaAdminClient, KafkaConsumer, KafkaProducer):  # every keyword is each client's own
        assert client.DEFAULT_CONFIG.keys() >= config.keys(), client
    creds = broker_credentials(scram)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.protocol.value, creds.mechanism.value, creds.username) == ("SASL_SSL", "SCRAM-SHA-512", "ledger")
    assert creds.password == PASSWORD and creds.ssl_context is not None
    tls = base_settings.model_copy(update={"kafka_security_protocol": "SSL", "kafka_ssl_cafile": certifi.where()})
    assert isinstance(broker_credentials(tls), faust.SSLCredentials)
    assert set(kafka_connection(tls)) == {"bootstrap_servers", "security_protocol", "ssl_context"}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("level", "aiokafka", "kafka"),
    [
        ("DEBUG", logging.INFO, logging.INFO),
        ("INFO", logging.INFO, logging.WARNING),
        ("WARNING",) + (logging.WARNING,) * 2,
    ],
)
def test_the_kafka_clients_never_log_below_info(base_settings: Settings, level: str, aiokafka: int, kafka: int) -> None:
    """Their DEBUG lines are the requests as sent: kafka-python's and aiokafka's SASL requests carry the password.
    kafka-python's INFO (each connection's life) only when DEBUG is asked for."""
    loggers = logging_config(base_settings, "worker", level=level)["loggers"]
    assert (loggers["aiokafka"]["level"], loggers["kafka"]["level"]) == (aiokafka, kafka)


@pytest.mark.unit
def test_a_sasl_node_config_names_its_listener_and_keeps_its_passwords_private(base_settings: Settings, tmp_path):
    broker = KafkaCluster(
        base_settings, tmp_path, [(19092, 19093)], sasl_users={"admin": ADMIN_PASSWORD, "ledger": PASSWORD}
    )
    broker._write_config(broker.node(1))
    config = broker.node(1).config
    props = dict(line.split("=", 1) for line in config.read_text().splitlines() if "=" in line)
    assert props["listeners"] == "SASL_PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["inter.broker.listener.name"] == "SASL_PLAINTEXT"
    assert props["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
    assert f'user_ledger="{PASSWORD}"' in props["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
    assert config.stat().st_mode & 0o077 == 0
    assert broker.client_settings(base_settings).kafka_sasl_username == "admin"
    tls = KafkaCluster(
        base_settings, tmp_path, [(19092, 19093)], sasl_users={"a": "b"}, tls=(tmp_path / "k", tmp_path / "c")
    )
    tls._write_config(tls.node(1))
    props = dict(line.split("=", 1) for line in tls.node(1).config.read_text().splitlines() if "=" in line)
    assert props["listeners"].startswith("SASL_SSL://") and props["ssl.keystore.location"] == str(tmp_path / "k")
    assert "listener.name.sasl_ssl.plain.sasl.jaas.config" in props and props["ssl.truststore.type"] == "PEM"
    client = tls.client_settings(base_settings)
    assert (client.kafka_security_protocol, client.kafka_ssl_cafile) == ("SASL_SSL", tmp_path / "c")
    for bad in ({"ledger": 'a"b'}, {"ledger": "a;b"}, {"ledger": ""}, {"led ger": "x"}):  # would break the JAAS line
        with pytest.raises(ValueError):
            KafkaCluster(base_settings, tmp_path, [(19092, 19093)], sasl_users=bad)

"""A store that `ledger` cannot reach is one line saying which store, at which address, and how to fix it.

The commands are read from the command line itself (`commands()` of the settings test: every command and
sub-command typer registers), so a new one is covered unless it is excluded below with a reason. Each runs as a
user runs it, `ledger <command>`, with settings that load (LEDGER_DEVELOPMENT=1) but point every store at a
loopback port where nothing listens: Kafka, PostgreSQL, Elasticsearch and the API. Each must end with exit code 3
and one line on stderr naming the store and its address (never the DSN's password), never a traceback.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from producers.keys.kek import new_kek
from tests.test_cli_settings_errors import NEED_NO_SETTINGS, commands, run, user_env

# the servers retry a store that is away by design (they wait for it instead of exiting): out of scope here
LONG_RUNNING = {
    ("serve",): "the API starts without its stores and answers 503 naming the one that is down",
    ("mcp",): "the MCP server starts without its stores, like the API",
    ("worker",): "the projector waits for Kafka and PostgreSQL, retrying",
    ("indexer",): "the indexer waits for PostgreSQL and Elasticsearch with a bounded backoff",
    ("embedder",): "the embedder waits for PostgreSQL, retrying",
}
NEED_NO_STORE = set(NEED_NO_SETTINGS)  # `schema` and `keys new-kek` read nothing but the code
EVENT = '{"type": "memory.asserted", "tenant": "demo", "subject": "s", "key": "k", "value": 1, "content": "c"}\n'
STDIN = {("publish",): EVENT}  # publish contacts the broker with the first event only
SECRET = "s3cret-pw"
# the command's own log records (producers.logs: kafka-python's "Bootstrap failed") and publish's progress bar
# may precede the one line
LOG_RECORD = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ \[|publishing )")


def dead_port() -> int:
    """A loopback port where nothing listens (bound, then released: connecting is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that takes connections and never answers (a server hung, or a firewall that drops)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


@pytest.mark.parametrize("postgres", ["refusing", "silent"])
def test_every_command_says_in_one_line_which_store_is_unreachable(postgres: str) -> None:
    """PostgreSQL silent too: `ledger verify` connected without a timeout and waited for ever."""
    with silent_port() as silent:
        _every_command_says_which_store(dead_port(), silent if postgres == "silent" else None)


def _every_command_says_which_store(port: int, pg_port: int | None) -> None:
    pg_port = pg_port or port
    env = user_env(
        LEDGER_DEVELOPMENT="1",
        LEDGER_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}",
        LEDGER_PG_DSN=f"postgresql://ledger:{SECRET}@127.0.0.1:{pg_port}/ledger",
        LEDGER_PG_CONNECT_TIMEOUT_S="2",
        LEDGER_ES_URL=f"http://127.0.0.1:{port}",
        LEDGER_API_PORT=str(port),
        LEDGER_PRODUCER_TIMEOUT_S="2",  # kafka-python retries a refused bootstrap until its timeout
        LEDGER_KEK=new_kek(),  # `keys rotate` needs a key to rotate to before it opens the store
    )
    paths = [p for p in commands() if p not in LONG_RUNNING and p not in NEED_NO_STORE]
    assert {("topics",), ("publish",), ("rebuild",), ("reindex",), ("keys", "status"), ("demo",)} <= set(paths)
    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(paths, pool.map(lambda p: run(p, env, STDIN.get(p, "")), paths), strict=True))
    for path, proc in done.items():
        name = " ".join(path)
        assert "Traceback" not in proc.stderr + proc.stdout, f"ledger {name}:\n{proc.stderr[-3000:]}"
        assert proc.returncode == 3, f"ledger {name} exited {proc.returncode}: {proc.stderr[-2000:]}"
        lines = [line for line in proc.stderr.strip().splitlines() if not LOG_RECORD.match(line)]
        assert len(lines) == 1, f"ledger {name}: {proc.stderr[-2000:]}"
        line = lines[0]
        assert proc.stderr.strip().endswith(line), f"ledger {name}: the line is not the last word: {proc.stderr}"
        assert line.startswith("ledger: ") and "is not reachable" in line, f"ledger {name}: {line}"
        assert (f"127.0.0.1:{port}" in line or f"127.0.0.1:{pg_port}" in line) and "LEDGER_" in line, line
        assert any(store in line for store in ("kafka", "postgres", "elasticsearch", "api")), line
        assert SECRET not in line, f"ledger {name} printed the DSN's password: {line}"


def test_a_publish_names_the_store_its_data_keys_come_from_and_runs_outside_development() -> None:
    """With encryption on, a publish needs a data key before the broker: the key endpoint (LEDGER_KEY_ENDPOINT) or
    the key store's database (LEDGER_PG_DSN), away, is the one line's store, not Kafka; and on a machine that only
    publishes (no LEDGER_DEVELOPMENT), Kafka away is the same one line, not the settings' refusal of what the servers
    read."""
    port = dead_port()
    runs = {
        "key endpoint": user_env(
            LEDGER_ENCRYPTION="on", LEDGER_KEY_ENDPOINT=f"http://127.0.0.1:{port}", LEDGER_KEY_API_KEY="k"
        ),
        "postgres": user_env(
            LEDGER_DEVELOPMENT="1",
            LEDGER_ENCRYPTION="on",
            LEDGER_KEK=new_kek(),
            LEDGER_PG_DSN=f"postgresql://ledger:{SECRET}@127.0.0.1:{port}/ledger",
        ),
        "kafka": user_env(LEDGER_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}", LEDGER_PRODUCER_TIMEOUT_S="2"),
    }
    for store, env in runs.items():
        proc = run(("publish",), env, EVENT)
        assert "Traceback" not in proc.stderr and proc.returncode == 3, f"{store}: {proc.stderr[-2000:]}"
        line = proc.stderr.strip().splitlines()[-1]
        assert line.startswith(f"ledger: {store} at ") and f"127.0.0.1:{port}" in line, f"{store}: {line}"
        assert SECRET not in line, line


def test_verify_with_only_kafka_away_says_so_in_its_one_line_and_nothing_else(base_settings) -> None:
    """PostgreSQL answers, no broker does: the one line names Kafka, found at once by a probe, with none of
    kafka-python's own lines about each connection retried before it."""
    port = dead_port()
    env = user_env(
        LEDGER_DEVELOPMENT="1",
        LEDGER_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}",
        LEDGER_PG_DSN=base_settings.pg_dsn,
        LEDGER_PRODUCER_TIMEOUT_S="2",
    )
    proc = run(("verify",), env)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"ledger: kafka at 127.0.0.1:{port} is not reachable (KafkaTimeoutError): start it (`python -m infra up`) "
        "or set LEDGER_KAFKA_BOOTSTRAP"
    ], proc.stderr[-2000:]


def test_verify_with_postgres_silent_says_so_in_its_one_line(base_settings) -> None:
    """The broker answers and PostgreSQL takes the connection but never answers: verify connected without a
    timeout there and waited for ever; now it ends in LEDGER_PG_CONNECT_TIMEOUT_S with the one line."""
    with silent_port() as port:
        env = user_env(
            LEDGER_DEVELOPMENT="1",
            LEDGER_KAFKA_BOOTSTRAP=base_settings.kafka_bootstrap,
            LEDGER_PG_DSN=f"postgresql://ledger:{SECRET}@127.0.0.1:{port}/ledger",
            LEDGER_PG_CONNECT_TIMEOUT_S="2",
        )
        proc = run(("verify",), env)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"ledger: postgres at 127.0.0.1:{port}/"), proc.stderr


def test_the_kafka_probe_ends_quietly_when_no_broker_answers(base_settings) -> None:
    """The probe's thread outlives its caller's wait: kafka-python's refusal then ended it as an uncaught exception,
    which the crash hook logged with its traceback in the middle of `ledger verify` (its one line came after)."""
    import threading

    from producers.topics import probe

    caught: list[threading.ExceptHookArgs] = []
    before, threading.excepthook = threading.excepthook, caught.append
    try:
        dead = base_settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{dead_port()}", "producer_timeout_s": 1})
        assert probe(dead, timeout=0.2) is False  # the caller's wait ends before the thread's
        for thread in [t for t in threading.enumerate() if t.name == "kafka-probe"]:
            thread.join(30)
    finally:
        threading.excepthook = before
    assert caught == [], [f"{c.exc_type.__name__}: {c.exc_value}" for c in caught]

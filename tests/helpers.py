"""Shared helpers for tests that run the projector against the real servers.

- `wait_for(cond, timeout)`: poll a condition (no blind sleeps).
- `Worker(settings)`: the projector as a SUBPROCESS (`python -m stream_processors`) with the
  test's private LEDGER_* names; `.start()`, `.kill()` (SIGKILL), `.stop()` (SIGTERM), `.log()`.
- `publish(settings, events)` (SDK) and `publish_raw(settings, [(key, bytes)])` (bypassing it).
- `end_offsets(settings)`, `positions(settings)`, `wait_caught_up(settings, timeout)`: the
  PostgreSQL positions have reached the topic's end offsets.
- `pg(settings)`: a psycopg connection on the private schema; `cleanup(settings)` drops it and the topics.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from kafka import KafkaAdminClient, KafkaProducer

from producers.contract import MemoryEvent
from producers.sdk import LedgerProducer
from producers.settings import REPO_ROOT, Settings
from producers.topics import end_offsets, ensure_topics
from projections.postgres.connection import connect
from projections.postgres.positions import read_positions, wait_for_positions

__all__ = [
    "Worker",
    "cleanup",
    "end_offsets",
    "pg",
    "positions",
    "publish",
    "publish_raw",
    "settings_env",
    "wait_caught_up",
    "wait_for",
]


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = "condition") -> Any:
    """Return cond()'s first truthy value; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def settings_env(settings: Settings, **extra: Any) -> dict[str, str]:
    """The environment of a child process that uses exactly these settings (`Settings.child_environ`)."""
    return settings.child_environ(**extra)


class Worker:
    """`python -m stream_processors` as a child process, logging to a temp file."""

    def __init__(self, settings: Settings, module: str = "stream_processors", **extra_env: Any) -> None:
        self.settings = settings
        self.module = module
        self.env = settings_env(settings, **extra_env)
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="worker-", suffix=".log")[1])

    def start(self) -> Worker:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module], cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def publish(settings: Settings, events: Iterable[MemoryEvent | dict]) -> list:
    """Publish through the SDK (creates the topics); returns the PublishResults."""
    with LedgerProducer(settings) as producer:
        return producer.publish_many(list(events))


def publish_raw(settings: Settings, records: Sequence[tuple[bytes | None, bytes | None]]) -> list[tuple[int, int]]:
    """Write (key, value) records as they are, like a non-SDK client; returns (partition, offset) each."""
    ensure_topics(settings)
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=5)
    try:
        futures = [producer.send(settings.topic, key=k, value=v) for k, v in records]
        producer.flush(30)
        return [(m.partition, m.offset) for m in (f.get(30) for f in futures)]
    finally:
        producer.close(5)


def pg(settings: Settings) -> psycopg.Connection:
    """Autocommit connection with search_path = the private schema (statements not prepared, like the worker's:
    a rebuild may rename schemas under it)."""
    return connect(settings.pg_dsn, settings.pg_schema, autocommit=True, prepare_threshold=None)


def positions(settings: Settings) -> dict[int, int]:
    return read_positions(settings)


def wait_caught_up(settings: Settings, timeout: float = 60.0, worker: Worker | None = None) -> dict[int, int]:
    """Wait until the stored positions reach the topic's current end offsets (fails fast if the worker died)."""
    ends = {p: o for p, o in end_offsets(settings).items() if o > 0}

    def check() -> None:
        if worker is not None and not worker.alive():
            raise AssertionError(
                f"worker exited ({worker.proc.returncode if worker.proc else '?'}):\n{worker.log()[-4000:]}"
            )

    wait_for_positions(settings, ends, timeout, check=check)
    return ends


def cleanup(settings: Settings) -> None:
    """Drop the private schema (and rebuild leftovers), the search indices, the worker's faust dir and topics."""
    from elasticsearch import Elasticsearch

    from projections.search.mapping import physical_indices

    es = Elasticsearch(settings.es_url, request_timeout=30)
    try:
        for name in physical_indices(es, settings.es_index):
            es.indices.delete(index=name, ignore_unavailable=True)
    finally:
        es.close()
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname = %s OR nspname LIKE %s",
                (settings.pg_schema, settings.pg_schema + "\\_%"),
            ).fetchall()
        ]
        for name in names:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    shutil.rmtree(settings.data_dir / "faust" / settings.processor_group, ignore_errors=True)
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        existing = set(admin.list_topics())
        doomed = [t for t in (settings.topic, settings.dlq_topic) if t in existing]
        if doomed:
            admin.delete_topics(doomed)
    except Exception:  # noqa: BLE001 - clean-up is best effort
        pass
    finally:
        admin.close()

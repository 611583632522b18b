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

import os
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
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from producers.contract import MemoryEvent
from producers.sdk import LedgerProducer
from producers.settings import REPO_ROOT, Settings
from producers.topics import ensure_topics
from projections.postgres.recorder import connect

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
    """LEDGER_* variables that make a child process use exactly these settings' names and addresses."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    for name in (
        "kafka_bootstrap",
        "topic",
        "dlq_topic",
        "topic_partitions",
        "pg_dsn",
        "pg_schema",
        "es_url",
        "es_index",
        "processor_group",
        "processor_batch_size",
        "processor_batch_seconds",
        "data_dir",
    ):
        env[f"LEDGER_{name.upper()}"] = str(getattr(settings, name))
    for k, v in extra.items():
        env[f"LEDGER_{k.upper()}"] = str(v)
    return env


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


def end_offsets(settings: Settings, topic: str | None = None) -> dict[int, int]:
    topic = topic or settings.topic
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def pg(settings: Settings) -> psycopg.Connection:
    """Autocommit connection with search_path = the private schema."""
    conn = connect(settings.pg_dsn, settings.pg_schema)
    conn.autocommit = True
    return conn


def positions(settings: Settings) -> dict[int, int]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (f'"{settings.pg_schema}".positions',)).fetchone()
        if not exists or exists[0] is None:
            return {}
        rows = conn.execute(
            f'SELECT "partition", next_offset FROM "{settings.pg_schema}".positions WHERE consumer = %s AND topic = %s',
            (settings.processor_group, settings.topic),
        ).fetchall()
    return dict(rows)


def wait_caught_up(settings: Settings, timeout: float = 60.0, worker: Worker | None = None) -> dict[int, int]:
    """Wait until the stored positions reach the topic's current end offsets (fails fast if the worker died)."""
    ends = {p: o for p, o in end_offsets(settings).items() if o > 0}

    def done() -> bool:
        if worker is not None and not worker.alive():
            raise AssertionError(
                f"worker exited ({worker.proc.returncode if worker.proc else '?'}):\n{worker.log()[-4000:]}"
            )
        stored = positions(settings)
        return all(stored.get(p, 0) >= o for p, o in ends.items())

    wait_for(done, timeout, interval=0.2, what=f"positions to reach {ends}")
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

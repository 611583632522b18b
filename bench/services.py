"""Run the ledger's own processes (worker, indexer, API) as subprocesses on private names.

A benchmark or an end-to-end test must measure the processes a deployment runs, not
functions called in-process: each part is started the way an operator starts it
(`ledger worker`, `ledger indexer`, uvicorn on `api.main:app`) with the LEDGER_*
variables of a private Settings (`Settings.child_environ`: topic, schema, index, port, API
keys, every other field too). `stop()` ends exactly the processes this object started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from elasticsearch import Elasticsearch
from kafka import KafkaAdminClient

from producers.settings import REPO_ROOT, Settings
from projections.postgres.schema import drop_schema

__all__ = ["Services", "drop_private", "free_port"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Services:
    """Start/stop the worker, the search indexers, the embedders and the API for one Settings; logs go to
    `log_dir`."""

    settings: Settings
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    def _cmd(self, name: str) -> list[str]:
        py = sys.executable
        if name == "worker":
            return [py, "-m", "api.cli", "worker", "--loglevel", "warning"]
        if name.startswith("indexer"):  # indexer, indexer-2, ...: any number share the outbox (issue 14)
            return [py, "-m", "api.cli", "indexer"]
        if name.startswith("embedder"):
            return [py, "-m", "api.cli", "embedder"]
        if name == "api":
            return [
                py,
                "-m",
                "uvicorn",
                "api.main:app",
                "--host",
                self.settings.api_host,
                "--port",
                str(self.settings.api_port),
                "--log-level",
                "warning",
                "--no-access-log",
            ]
        raise ValueError(f"unknown service {name!r}")

    def start(self, *names: str) -> None:
        env = {**self.settings.child_environ(), "PYTHONUNBUFFERED": "1"}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in names:
            if name in self.procs and self.procs[name].poll() is None:
                continue
            log = (self.log_dir / f"{name}.log").open("ab")
            self.procs[name] = subprocess.Popen(
                self._cmd(name), cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if "api" in names:
            self.wait_api()

    def check_alive(self) -> None:
        """Raise if a started process died (with the tail of its log), instead of waiting forever on it."""
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {p.returncode}; log tail:\n{tail}")

    def wait_api(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"API at {self.url} not up after {timeout}s")
            time.sleep(0.2)

    def stop(self, *names: str, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`, of the named processes (default: all we started)."""
        for name in names or tuple(self.procs):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def drop_private(s: Settings) -> None:
    """Remove what a private run created: its schemas (live, rebuilt, old), index and alias, topics."""
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        for (name,) in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = %s OR nspname LIKE %s",
            (s.pg_schema, s.pg_schema + "\\_%"),
        ).fetchall():
            drop_schema(conn, name)
    es = Elasticsearch(s.es_url, request_timeout=60)
    try:
        for name in es.indices.get(index=f"{s.es_index}*", allow_no_indices=True):
            es.indices.delete(index=name, ignore_unavailable=True)
    finally:
        es.close()
    admin = KafkaAdminClient(bootstrap_servers=s.kafka_bootstrap)
    try:
        existing = set(admin.list_topics())
        admin.delete_topics([t for t in (s.topic, s.dlq_topic, s.access_topic) if t in existing])
    finally:
        admin.close()

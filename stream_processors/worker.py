"""Run the projector worker: `python -m stream_processors` or `ledger worker`.

Creates the topics (producers.topics) and the schema (idempotent), then runs one faust worker
for the configured settings (group = LEDGER_PROCESSOR_GROUP): the ledger's agent and the access
topic's (stream_processors.access). Start several for more
throughput: they share the partitions, and the PostgreSQL position guard keeps every effect
exactly-once across rebalances and crashes.
"""

from __future__ import annotations

import gc
import logging

import faust
import psycopg

from producers.keys.store import key_context
from producers.logs import configure_logging
from producers.metrics import serve as serve_metrics
from producers.settings import Settings, get_settings
from producers.topics import ensure_topics
from projections.postgres.chain import Checkpoints
from projections.postgres.connection import held
from projections.postgres.schema import create_schema
from stream_processors.access import attach_access
from stream_processors.agents import attach
from stream_processors.app import make_app

__all__ = ["prepare", "run"]

log = logging.getLogger(__name__)


def prepare(settings: Settings) -> None:
    """Topics, schema and key store exist, and the KEK fits, before the consumer joins (KekError otherwise)."""
    ensure_topics(settings)
    (settings.data_dir / "faust" / settings.processor_group).mkdir(parents=True, exist_ok=True)
    with psycopg.connect(settings.pg_dsn, **held(settings)) as conn:
        create_schema(conn, settings.pg_schema)
        key_context(settings, conn)  # a missing or wrong key-encryption key stops the worker here
    Checkpoints.for_settings(settings)  # so does a chain signing key that is configured and cannot be read


def run(settings: Settings | None = None, *, loglevel: str | None = None) -> None:
    """Block running the worker until it is stopped (SIGTERM/SIGINT); `loglevel` overrides LEDGER_LOG_LEVEL."""
    settings = settings or get_settings()
    configure_logging(settings, "worker", level=loglevel)  # producers.logs; faust leaves it alone (below)
    prepare(settings)
    serve_metrics(settings.worker_metrics_port, settings.metrics_host, setting="LEDGER_WORKER_METRICS_PORT")
    app = make_app(settings)
    runner = attach(app, settings)
    access_runner = attach_access(app, settings)  # the access topic's agent, same group
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, override_logging=False)
    worker.spinner = None  # it writes terminal control codes to stdout, between our log lines
    # Everything made so far (modules, the app, its agents) lives as long as the process: out of the collector's
    # way, so the full collections a stream of batches triggers do not walk it again and again.
    gc.freeze()
    try:
        worker.execute_from_commandline()
    finally:
        runner.close()
        access_runner.close()

"""What a private run leaves behind, dropped in one place: the benchmarks and the tests run on private names
(their own topics, schema, index, faust group), and both end with `drop_private(settings)`.
"""

from __future__ import annotations

import shutil
import socket

import psycopg
from elasticsearch import Elasticsearch
from kafka import KafkaAdminClient

from producers.settings import Settings
from projections.postgres.schema import drop_schema
from projections.search.client import es_client
from projections.search.mapping import physical_indices

__all__ = ["drop_indices", "drop_private", "free_port"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a private API or server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def drop_indices(es: Elasticsearch, settings: Settings) -> None:
    """The alias's physical indices, any other `<index>-*` (reindex leftovers) and an index named like the alias."""
    names = set(physical_indices(es, settings.es_index))
    names |= set(es.indices.get(index=f"{settings.es_index}-*", allow_no_indices=True))
    if es.indices.exists(index=settings.es_index) and not es.indices.exists_alias(name=settings.es_index):
        names.add(settings.es_index)
    for name in sorted(names):
        es.indices.delete(index=name, ignore_unavailable=True)


def drop_private(settings: Settings) -> None:
    """Drop what the private names hold: the search indices, the schema and its rebuild leftovers and key store
    (`<schema>_*`), the worker's faust directory and the topics (those best effort: a run that never created
    them, or a Kafka that is down, still ends)."""
    es = es_client(settings.es_url, request_timeout=60)
    try:
        drop_indices(es, settings)
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
            drop_schema(conn, name)
    shutil.rmtree(settings.data_dir / "faust" / settings.processor_group, ignore_errors=True)
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        existing = set(admin.list_topics())
        doomed = [t for t in (settings.topic, settings.dlq_topic, settings.access_topic) if t in existing]
        if doomed:
            admin.delete_topics(doomed)
    except Exception:  # noqa: BLE001 - clean-up is best effort
        pass
    finally:
        admin.close()

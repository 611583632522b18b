"""What a private run leaves behind, dropped in one place: the benchmarks and the tests run on private names
(their own topics, schema, index, faust group), and both end with `drop_private(settings)`.
"""

from __future__ import annotations

import shutil
import socket
import uuid

import psycopg
from elasticsearch import Elasticsearch
from kafka import KafkaAdminClient

from producers.kafka_producer import kafka_connection
from producers.settings import Settings
from projections.postgres.schema import drop_schema
from projections.search.client import es_client
from projections.search.mapping import physical_indices

__all__ = ["drop_indices", "drop_private", "free_port", "free_ports", "unique_name"]


def unique_name(prefix: str) -> str:
    """A private name no other run picks, even one started in the same second (`Settings.private` takes it)."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a private API or server."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on 127.0.0.1 now (all held open together while they are picked), for the nodes
    of a private cluster."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
    es = es_client(settings, request_timeout=60)
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
    admin = KafkaAdminClient(**kafka_connection(settings))
    try:
        existing = set(admin.list_topics())
        doomed = [t for t in (settings.topic, settings.dlq_topic, settings.access_topic) if t in existing]
        if doomed:
            admin.delete_topics(doomed)
    except Exception:  # noqa: BLE001 - clean-up is best effort
        pass
    finally:
        admin.close()

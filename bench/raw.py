"""The raw speed of each component alone, on the same data the ledger ingests.

These are the denominators of every ratio in BENCHMARKS.md: what Kafka, PostgreSQL,
Elasticsearch and the embedding model do with nothing of ours in the way.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import orjson
import psycopg
from elasticsearch import helpers
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from producers.kafka_producer import kafka_connection
from producers.settings import Settings
from projections.embedding import load_embedder
from projections.search.client import es_client

__all__ = ["bench_es_bulk", "bench_fastembed", "bench_kafka_produce", "bench_pg_copy"]


def _rate(n: int, seconds: float) -> dict:
    return {"n": n, "seconds": round(seconds, 3), "per_s": round(n / seconds, 1) if seconds > 0 else None}


def bench_kafka_produce(s: Settings, payloads: Sequence[tuple[bytes, bytes]], partitions: int = 6) -> dict:
    """kafka-python, acks=all, idempotent, the same keys and bytes the ledger publishes."""
    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(**kafka_connection(s))
    admin.create_topics([NewTopic(topic, partitions, s.topic_replication)])
    producer = KafkaProducer(**kafka_connection(s), acks="all", linger_ms=5, batch_size=256 * 1024)
    try:
        t0 = time.perf_counter()
        for key, value in payloads:
            producer.send(topic, key=key, value=value)
        producer.flush()
        return _rate(len(payloads), time.perf_counter() - t0)
    finally:
        producer.close()
        admin.delete_topics([topic])
        admin.close()


def bench_pg_copy(s: Settings, rows: Sequence[dict]) -> dict:
    """COPY of event rows (id, tenant, subject, key, payload jsonb) into an unlogged-free plain table."""
    schema = f"bench_raw_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(s.pg_dsn) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(
            f'CREATE TABLE "{schema}".ev (event_id text PRIMARY KEY, tenant text, subject text, key text, '
            "payload jsonb)"
        )
        conn.commit()
        try:
            t0 = time.perf_counter()
            with (
                conn.cursor() as cur,
                cur.copy(f'COPY "{schema}".ev (event_id, tenant, subject, key, payload) FROM STDIN') as copy,
            ):
                for r in rows:
                    copy.write_row((r["event_id"], r["tenant"], r["subject"], r.get("key"), orjson.dumps(r).decode()))
            conn.commit()
            return _rate(len(rows), time.perf_counter() - t0)
        finally:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            conn.commit()


def bench_es_bulk(s: Settings, docs: Sequence[dict], vectors: Sequence[Sequence[float]]) -> dict:
    """helpers.bulk of documents with their dense vectors (cosine HNSW), refresh at the end."""
    index = f"bench-raw-{uuid.uuid4().hex[:8]}"
    es = es_client(s, request_timeout=120)  # the serializers ours use: ES is measured, not json
    es.indices.create(
        index=index,
        settings={"number_of_shards": 1, "number_of_replicas": 0},
        mappings={
            "properties": {
                "tenant": {"type": "keyword"},
                "subject": {"type": "keyword"},
                "content": {"type": "text"},
                "vec": {"type": "dense_vector", "dims": len(vectors[0]), "similarity": "cosine", "index": True},
            }
        },
    )
    try:
        actions = (
            {
                "_index": index,
                "_id": d["event_id"],
                "tenant": d["tenant"],
                "subject": d["subject"],
                "content": d.get("content", ""),
                "vec": list(map(float, v)),
            }
            for d, v in zip(docs, vectors, strict=True)
        )
        t0 = time.perf_counter()
        helpers.bulk(es, actions, chunk_size=500)
        es.indices.refresh(index=index)
        return _rate(len(docs), time.perf_counter() - t0)
    finally:
        es.indices.delete(index=index)
        es.close()


def bench_fastembed(s: Settings, texts: Sequence[str]) -> tuple[dict, list]:
    """Embedding throughput of the configured model (each text embedded alone, as the embedder does)."""
    embedder = load_embedder(s)
    embedder.embed(list(texts[:8]))  # warm up
    t0 = time.perf_counter()
    vecs = embedder.embed(list(texts))
    return _rate(len(texts), time.perf_counter() - t0), vecs.tolist()

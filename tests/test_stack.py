"""Each part of the stack is real and usable from Python."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import psycopg
import pytest
from elasticsearch import Elasticsearch
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from producers.settings import Settings
from projections.embedding import load_embedder


def _topic(settings: Settings, partitions: int = 3) -> str:
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(settings.topic, partitions, 1)])
    finally:
        admin.close()
    return settings.topic


def test_kafka_produce_and_consume_with_kafka_python(settings: Settings) -> None:
    topic = _topic(settings)
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    sent = [producer.send(topic, key=f"k{i % 5}".encode(), value=f"v{i}".encode()) for i in range(50)]
    producer.flush()
    metas = [f.get(timeout=10) for f in sent]
    producer.close()
    assert all(m.offset >= 0 for m in metas)
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=f"g-{uuid.uuid4().hex[:6]}",
        consumer_timeout_ms=15000,
        session_timeout_ms=10000,
    )
    got = []
    for record in consumer:
        got.append(record.value.decode())
        if len(got) == 50:
            break
    consumer.close()
    assert sorted(got) == sorted(f"v{i}" for i in range(50))


def test_kafka_consume_with_a_faust_agent(settings: Settings) -> None:
    import faust

    topic_name = _topic(settings, partitions=1)
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    for i in range(10):
        producer.send(topic_name, value=f"m{i}".encode())
    producer.flush()
    producer.close()

    app = faust.App(
        f"stack-test-{uuid.uuid4().hex[:6]}",
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="memory://",
        value_serializer="raw",
        web_enabled=False,
        topic_replication_factor=1,
        broker_session_timeout=10,
        broker_heartbeat_interval=3.3,
        broker_rebalance_timeout=10,
        consumer_auto_offset_reset="earliest",
    )
    topic = app.topic(topic_name, value_type=bytes, value_serializer="raw")
    seen: list[str] = []
    done = asyncio.Event()

    @app.agent(topic)
    async def collect(stream):
        async for value in stream:
            seen.append(value.decode())
            if len(seen) == 10:
                done.set()

    async def main() -> None:
        await app.start()
        try:
            await asyncio.wait_for(done.wait(), timeout=60)
        finally:
            await app.stop()

    asyncio.run(main())
    assert seen == [f"m{i}" for i in range(10)]


def test_postgres_round_trip(settings: Settings) -> None:
    with psycopg.connect(settings.pg_dsn) as conn:
        conn.execute(f'CREATE SCHEMA "{settings.pg_schema}"')
        try:
            conn.execute(f'CREATE TABLE "{settings.pg_schema}".t (id int primary key, doc jsonb, note text)')
            conn.execute(
                f'INSERT INTO "{settings.pg_schema}".t VALUES (%s, %s::jsonb, %s)',
                (1, '{"port": 8080}', "后端服务端口"),
            )
            row = conn.execute(f'SELECT doc, note FROM "{settings.pg_schema}".t WHERE id = 1').fetchone()
            assert row == ({"port": 8080}, "后端服务端口")
        finally:
            conn.execute(f'DROP SCHEMA "{settings.pg_schema}" CASCADE')


@pytest.fixture(scope="module")
def embedder():
    return load_embedder()


def test_elasticsearch_knn_and_bm25_including_chinese(settings: Settings, embedder) -> None:
    es = Elasticsearch(settings.es_url)
    index = settings.es_index
    dim = embedder.dim
    es.indices.create(
        index=index,
        settings={
            "number_of_shards": 1,
            "number_of_replicas": 0,
            "analysis": {
                "filter": {"bigram": {"type": "shingle", "max_shingle_size": 2}},
                "analyzer": {"cjk_bigram": {"tokenizer": "standard", "filter": ["lowercase", "bigram"]}},
            },
        },
        mappings={
            "properties": {
                "content": {"type": "text", "analyzer": "cjk_bigram"},
                "vec": {"type": "dense_vector", "dims": dim, "similarity": "cosine", "index": True},
            }
        },
    )
    try:
        docs = ["项目 P1 的后端服务端口是 8080", "user 42 prefers window seats", "今天中午吃什么"]
        for i, (text, vec) in enumerate(zip(docs, embedder.embed(docs), strict=True)):
            es.index(index=index, id=str(i), document={"content": text, "vec": vec.tolist()})
        es.indices.refresh(index=index)

        bm25 = es.search(index=index, query={"match": {"content": "后端服务"}})
        assert bm25["hits"]["hits"][0]["_id"] == "0"
        bm25_en = es.search(index=index, query={"match": {"content": "window seats"}})
        assert bm25_en["hits"]["hits"][0]["_id"] == "1"

        qvec = embedder.embed_query("P1 的后端服务地址是什么")
        knn = es.search(index=index, knn={"field": "vec", "query_vector": qvec.tolist(), "k": 3, "num_candidates": 10})
        assert knn["hits"]["hits"][0]["_id"] == "0"
    finally:
        es.indices.delete(index=index)
        es.close()


def test_fastembed_loads_the_on_disk_model_and_ranks_chinese_sensibly(embedder) -> None:
    q, near, far = embedder.embed(["P1 的后端服务地址是什么", "项目 P1 的后端服务端口是 8080", "今天中午吃什么"])
    for v in (q, near, far):
        assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-3
    assert float(q @ near) > float(q @ far) + 0.1


def test_infra_sets_a_roles_password_without_writing_it_where_others_read(settings: Settings) -> None:
    """infra's statement setting the role's password ran as `psql -c ...`: the password stood in postgres.log, which
    every user of the machine reads, and in `ps`. It goes in on stdin: the log has the command, not the statement."""
    import secrets
    from urllib.parse import urlsplit

    from infra import postgres

    password, role = "pw-" + secrets.token_hex(12), f"r_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(settings.pg_dsn)
    dsn = f"postgresql://{role}:{password}@{parts.hostname}:{parts.port}{parts.path}"
    s = settings.model_copy(update={"pg_dsn": dsn})
    try:
        postgres._create_role_and_db(s, postgres.install(s))
        with psycopg.connect(settings.pg_dsn) as conn:
            assert conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() == (1,)
        assert password not in postgres._paths(s)["log"].read_text(errors="replace")
    finally:  # as infra itself speaks to its server: the superuser over the socket
        sock = str(postgres._paths(s)["sock"])
        with psycopg.connect(host=sock, port=parts.port, user="postgres", dbname="postgres", autocommit=True) as c:
            c.execute(f'DROP ROLE IF EXISTS "{role}"')

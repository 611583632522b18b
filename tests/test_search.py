"""The search projection against the real servers: outbox -> indexer -> Elasticsearch, reindex, orphans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from elasticsearch import ConnectionError as ESConnectionError
from elasticsearch import Elasticsearch

from producers.contract import EventType, MemoryEvent
from projections.embedding import load_embedder
from projections.search.embedder import embed_once
from projections.search.indexer import DrainStats, drain_once, lock_key
from projections.search.mapping import physical_indices
from projections.search.reindex import orphans, reindex
from tests.support import RecorderWriter as Ledger
from tests.support import drain_all, outbox_count, private_store
from tests.support.stores import embed_queue_count

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def embedder(base_settings):
    return load_embedder(base_settings)


@pytest.fixture
def store(settings):
    with private_store(settings) as (conn, es):
        ledger = Ledger(settings, conn)
        try:
            yield settings, conn, es, ledger
        finally:
            ledger.close()


def _port(ledger: Ledger, value: int, at: datetime, tenant: str = "acme", **extra) -> MemoryEvent:
    return ledger.assert_fact(
        tenant,
        "project:P1",
        "project.backend_port",
        f"P1 的后端服务端口是 {value}",
        value,
        aliases=["端口", "backend port"],
        entities=["P1"],
        valid_from=at,
        **extra,
    )


def _doc(es: Elasticsearch, settings, version_id: str) -> dict:
    return es.get(index=settings.es_index, id=version_id, source_exclude_vectors=False)["_source"]


def test_outbox_rows_become_documents_first_and_get_their_vectors_after(store, embedder):
    """Two-phase indexing: the indexer writes the documents with no embedding on its path and queues
    them for the embedder, which stores the vectors and sends the versions back through the outbox."""
    settings, conn, es, ledger = store
    e1 = _port(ledger, 8080, T0)
    e2 = ledger.assert_fact("acme", "user:42", "preference.seat", "用户 42 喜欢靠窗的座位", "window", kind="preference")
    assert outbox_count(conn) == 2

    stats = DrainStats()
    assert drain_once(settings, conn, es, refresh=True, stats=stats) == 2
    assert outbox_count(conn) == 0 and embed_queue_count(conn) == 2
    assert (stats.indexed, stats.queued, stats.failed) == (2, 2, [])
    first = _doc(es, settings, e1.version_id)
    assert "embedding" not in first and first["content"] == e1.content and first["status"] == "active"

    done = embed_once(settings, conn, embedder)
    assert (done.claimed, done.stored, done.texts) == (2, 2, 2)
    assert embed_queue_count(conn) == 0 and outbox_count(conn) == 2  # the documents go round once more
    assert drain_once(settings, conn, es, refresh=True) == 2
    assert embed_queue_count(conn) == 0  # they have every configured vector now: nothing queued again

    doc = _doc(es, settings, e1.version_id)  # _id = version_id = version_id_for(tenant, event_id)
    assert doc["memory_id"] == e1.memory_id
    assert (doc["tenant"], doc["subject"], doc["key"], doc["status"]) == (
        "acme",
        "project:P1",
        "project.backend_port",
        "active",
    )
    assert doc["subject_ids"] == ["project:p1", "p1"] and doc["entities"] == ["p1"]
    assert doc["aliases"] == ["backend port", "端 口"] and doc["source_type"] == "explicit"
    assert len(doc["embedding"]) == embedder.dim and doc["valid_to"] is None
    assert _doc(es, settings, e2.version_id)["kind"] == "preference"
    # physical index behind the alias
    [physical] = physical_indices(es, settings.es_index)
    assert physical.startswith(settings.es_index + "-")


def test_one_event_id_in_two_tenants_is_two_documents(store, embedder):
    """The document id is the tenant-scoped version_id, never the producer's event_id: a second tenant that
    happens to choose the same event_id gets its own document instead of overwriting the first one's."""
    settings, conn, es, ledger = store
    shared = "same-event-id-in-two-tenants"
    a = _port(ledger, 8080, T0, tenant="acme", event_id=shared)
    b = _port(ledger, 9090, T0, tenant="globex", event_id=shared)
    drain_all(settings, conn, es, embedder)
    assert a.event_id == b.event_id and a.version_id != b.version_id
    assert {a.version_id, b.version_id}.isdisjoint({shared})
    docs = {t: _doc(es, settings, e.version_id) for t, e in (("acme", a), ("globex", b))}
    assert (docs["acme"]["tenant"], docs["acme"]["memory_id"]) == ("acme", a.memory_id)
    assert (docs["globex"]["tenant"], docs["globex"]["memory_id"]) == ("globex", b.memory_id)
    assert es.count(index=settings.es_index)["count"] == 2


def test_supersession_rewrites_the_old_document_with_its_stored_vector(store, embedder):
    settings, conn, es, ledger = store
    old = _port(ledger, 8080, T0)
    drain_all(settings, conn, es, embedder)
    vector = _doc(es, settings, old.version_id)["embedding"]
    new = _port(ledger, 9090, T0 + timedelta(days=3))

    stats = DrainStats()
    assert drain_once(settings, conn, es, refresh=True, stats=stats) == 2
    assert stats.indexed == 2 and stats.queued == 1  # only the new version needs an embedding
    old_doc = _doc(es, settings, old.version_id)
    assert old_doc["status"] == "superseded" and old_doc["superseded_by"] == new.version_id
    assert datetime.fromisoformat(old_doc["valid_to"]) == T0 + timedelta(days=3)
    assert old_doc["embedding"] == vector  # read back from PostgreSQL, not embedded again
    drain_all(settings, conn, es, embedder)
    new_doc = _doc(es, settings, new.version_id)
    assert len(new_doc["embedding"]) == embedder.dim
    assert new_doc["status"] == "active" and new_doc["version"] == 2


def test_redelivered_outbox_rows_rewrite_the_same_documents(store, embedder):
    settings, conn, es, ledger = store
    events = [
        _port(ledger, 8080, T0),
        ledger.assert_fact("acme", "user:42", "profile.city", "用户 42 住在杭州", "杭州"),
    ]
    drain_all(settings, conn, es, embedder)
    before = {e.version_id: _doc(es, settings, e.version_id) for e in events}

    # the same rows again (a crash after the bulk write and before the outbox delete)
    conn.execute(
        "INSERT INTO search_outbox (version_id, tenant, subject, op) SELECT version_id, tenant, subject, 'upsert' "
        "FROM fact_versions"
    )
    conn.execute(
        "INSERT INTO search_outbox (version_id, tenant, subject, op) SELECT version_id, tenant, subject, 'upsert' "
        "FROM fact_versions"
    )
    assert drain_all(settings, conn, es, embedder) == 4
    after = {e.version_id: _doc(es, settings, e.version_id) for e in events}
    assert after == before
    assert es.count(index=settings.es_index)["count"] == 2


def test_erasure_removes_the_subject_from_the_index(store, embedder):
    settings, conn, es, ledger = store
    _port(ledger, 8080, T0)
    keep = ledger.assert_fact("acme", "user:42", "profile.city", "用户 42 住在杭州", "杭州")
    drain_all(settings, conn, es, embedder)
    ledger.publish(MemoryEvent(type=EventType.ERASED, tenant="acme", subject="project:P1"))
    drain_all(settings, conn, es, embedder)
    ids = {h["_id"] for h in es.search(index=settings.es_index, size=100)["hits"]["hits"]}
    assert ids == {keep.version_id}
    assert orphans(settings, conn, es)["missing_in_pg"] == 0


def test_orphans_count_the_lag_and_are_zero_after_catch_up(store, embedder):
    settings, conn, es, ledger = store
    _port(ledger, 8080, T0)
    drain_all(settings, conn, es, embedder)
    _port(ledger, 9090, T0 + timedelta(days=1))
    lagging = orphans(settings, conn, es)
    assert (lagging["missing_in_es"], lagging["missing_in_pg"], lagging["outbox_pending"]) == (1, 0, 2)
    drain_all(settings, conn, es, embedder)
    caught_up = orphans(settings, conn, es)
    assert (caught_up["missing_in_es"], caught_up["missing_in_pg"], caught_up["outbox_pending"]) == (0, 0, 0)
    assert caught_up["pg_versions"] == caught_up["es_documents"] == 2
    # a document without its row is an orphan the other way round
    conn.execute("DELETE FROM fact_versions WHERE version = 1")
    assert orphans(settings, conn, es)["missing_in_pg"] == 1


def test_reindex_fills_a_new_index_and_switches_the_alias(store, embedder):
    settings, conn, es, ledger = store
    events = [_port(ledger, 8080, T0), _port(ledger, 9090, T0 + timedelta(days=1))]
    events.append(ledger.assert_fact("acme", "user:42", "profile.city", "用户 42 住在杭州", "杭州"))
    drain_all(settings, conn, es, embedder)
    [old] = physical_indices(es, settings.es_index)
    before = {e.version_id: _doc(es, settings, e.version_id) for e in events}

    seen = []
    report = reindex(
        settings, conn, es, embedder, batch_size=2, progress=lambda done, total: seen.append((done, total))
    )
    assert report["documents"] == 3 and report["replaced"] == [old]
    assert seen[-1] == (3, 3)
    assert physical_indices(es, settings.es_index) == [report["index"]]
    assert not es.indices.exists(index=old)
    after = {e.version_id: _doc(es, settings, e.version_id) for e in events}
    assert after.keys() == before.keys()
    assert after == before  # the same documents: the stored vectors are copied, not embedded again
    assert report["embedded"] == 0
    # the indexer keeps writing into the new index
    _port(ledger, 7070, T0 + timedelta(days=2))
    drain_all(settings, conn, es, embedder)
    assert es.count(index=report["index"])["count"] == 4


def test_no_indexer_writes_while_a_reindex_holds_the_lock(store, embedder):
    settings, conn, es, ledger = store
    _port(ledger, 8080, T0)
    other = psycopg.connect(settings.pg_dsn, autocommit=True)
    try:
        assert other.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (lock_key(settings),)).fetchone()[
            0
        ]
        assert drain_once(settings, conn, es) == 0
        assert outbox_count(conn) == 1
        other.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (lock_key(settings),))
        assert drain_once(settings, conn, es, refresh=True) == 1
    finally:
        other.close()


def test_elasticsearch_down_keeps_the_outbox_and_a_later_drain_catches_up(store, embedder):
    settings, conn, es, ledger = store
    _port(ledger, 8080, T0)
    dead = Elasticsearch("http://127.0.0.1:9", request_timeout=2, max_retries=0)
    with pytest.raises(ESConnectionError):
        drain_once(settings, conn, dead)
    assert outbox_count(conn) == 1  # PostgreSQL kept it; nothing was lost
    _port(ledger, 9090, T0 + timedelta(days=1))
    assert drain_all(settings, conn, es, embedder) == 3 + 2  # and each version once more with its vectors


def test_rejected_documents_stay_in_the_outbox(store, embedder):
    settings, conn, es, ledger = store
    _port(ledger, 8080, T0)
    drain_all(settings, conn, es, embedder)
    [physical] = physical_indices(es, settings.es_index)
    es.indices.close(index=physical)  # every write is now refused by the server
    try:
        _port(ledger, 9090, T0 + timedelta(days=1))
        stats = DrainStats()
        try:
            drain_once(settings, conn, es, stats=stats)
        except Exception:  # noqa: BLE001 - refused before the bulk (mget on a closed index) is fine too
            pass
        assert outbox_count(conn) == 2
    finally:
        es.indices.open(index=physical, wait_for_active_shards=1)
    assert drain_all(settings, conn, es, embedder) == 2 + 1  # the new version once more with its vector
    assert es.count(index=settings.es_index)["count"] == 2

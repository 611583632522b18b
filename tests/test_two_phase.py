"""Two-phase indexing: documents first, vectors after; any number of indexers and embedders.

Against the real servers, through the code the processes run (`drain_once`, `claim`/`complete`/`embed_once`):
a version is answered by the exact and keyword stages before any embedder ran and by the semantic stage after;
/v1/stats reports both lags; a late vector never revives a superseded version and never lands on another
version's document; a stale document write is refused by its revision; two claimers never share a row; an
erasure during an embedding stores nothing. The processes killed mid-stream are tests/faults/test_indexer_scale.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import psycopg
import pytest
from elasticsearch import Elasticsearch
from fastapi.testclient import TestClient

from api.main import create_app
from producers.contract import EventType, MemoryEvent
from producers.settings import REPO_ROOT
from projections.embedding import Embedders, load_embedder
from projections.languages import vector_plan
from projections.search.documents import embedding_text_for
from projections.search.embedder import claim, complete, embed_once
from projections.search.indexer import DrainStats, _bulk, doc_action, drain_once, read_rows
from projections.search.vectors import unpack
from tests.conftest import unique
from tests.support import RecorderWriter as Ledger
from tests.support import drain_all, embed_queue_count, outbox_count, private_store

TENANT, KEY = "twophase", "k-two-phase"
H = {"X-API-Key": KEY}
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def embedder(base_settings):
    return load_embedder(base_settings)


@pytest.fixture
def store(base_settings):
    settings = base_settings.private(unique("tp"), api_keys={KEY: [TENANT]})
    with private_store(settings) as (conn, es), Ledger(settings, conn) as ledger:
        yield settings, conn, es, ledger


def _doc(es: Elasticsearch, settings, vid: str) -> dict:
    return es.get(index=settings.es_index, id=vid, source_exclude_vectors=False)["_source"]


def _recall(client: TestClient, query: str, mode: str = "auto") -> dict:
    r = client.post("/v1/recall", headers=H, json={"tenant": TENANT, "query": query, "mode": mode, "top_k": 5})
    assert r.status_code == 200, r.text
    return r.json()


def _port(ledger: Ledger, port: int, at: datetime, subject: str = "project:Q7"):
    return ledger.assert_fact(
        TENANT,
        subject,
        "project.backend_port",
        f"项目 Q7 的后端服务端口是 {port}",
        port,
        entities=["Q7"],
        aliases=["端口"],
        valid_from=at,
    )


def test_a_document_answers_exact_and_keyword_before_its_vector_and_semantic_after(store, embedder):
    settings, conn, es, ledger = store
    fact = _port(ledger, 8080, T0)
    chat = ledger.assert_fact(TENANT, "person:ann", None, "Ann adopted a grey kitten named Pixel", kind="episodic")
    assert drain_once(settings, conn, es, refresh=True) == 2
    assert embed_queue_count(conn) == 2
    with TestClient(create_app(settings)) as client:
        body = _recall(client, "Q7 项目的端口是多少")
        assert body["hits"][0]["version_id"] == fact.version_id and body["hits"][0]["match"]["stage"] == "exact"
        words = _recall(client, "grey kitten Pixel", mode="keyword")
        assert [h["version_id"] for h in words["hits"]] == [chat.version_id]
        assert _recall(client, "what pet does Ann have", mode="semantic")["hits"] == []  # no vector yet
        lag = client.get("/v1/stats", headers=H, params={"tenant": TENANT}).json()["search"]
        assert lag["vectors_pending"] == 2 and lag["vectors_lag_s"] >= 0 and lag["documents_lag_s"] is None
        assert lag["es_documents"] == 2

        drain_all(settings, conn, es, embedder)
        semantic = _recall(client, "what pet does Ann have", mode="semantic")
        assert semantic["hits"][0]["version_id"] == chat.version_id
        lag = client.get("/v1/stats", headers=H, params={"tenant": TENANT}).json()["search"]
        assert (lag["vectors_pending"], lag["vectors_lag_s"], lag["documents_lag_s"]) == (0, None, None)
        consistency = client.get("/v1/stats/consistency", headers=H, params={"tenant": TENANT}).json()
        assert consistency["consistent"], consistency


def test_every_document_carries_the_vectors_of_its_own_text(store, embedder):
    """Many versions embedded in shared batches: each document's vector is its own text's, in every field."""
    settings, conn, es, ledger = store
    texts = [f"Ticket {i} is about the {w} service" for i, w in enumerate(["billing", "search", "login", "mail"])]
    texts += ["用户 42 住在杭州", "用户 43 喜欢靠窗的座位", "Erin's birthday is on the 3rd of March"]
    events = [ledger.assert_fact(TENANT, f"s:{i}", f"k.{i}", t) for i, t in enumerate(texts)]
    drain_all(settings, conn, es, embedder)
    models = Embedders(settings, embedder)
    rows = read_rows(conn, [e.version_id for e in events])
    # each text's vectors embedded alone (int8 models quantize per batch, so a vector of a shared batch differs in
    # the third decimal: its own text's vector is the nearest by far, never the same bits)
    alone = {
        v: {f: np.asarray(vec) for f, _, vec in models.vectors([embedding_text_for(r)])[0]} for v, r in rows.items()
    }
    for e in events:
        doc, row = _doc(es, settings, e.version_id), rows[e.version_id]
        plan = vector_plan(settings, embedding_text_for(row))
        assert doc["embed_model"] == [m for _, m in plan]
        for field, _ in plan:
            got = np.asarray(doc[field])
            nearest = max((v for v in alone if field in alone[v]), key=lambda v: float(got @ alone[v][field]))
            assert nearest == e.version_id and float(got @ alone[e.version_id][field]) > 0.98


def test_a_late_vector_never_revives_a_superseded_version(store, embedder):
    settings, conn, es, ledger = store
    old = _port(ledger, 8080, T0)
    drain_once(settings, conn, es, refresh=True)
    embedding = psycopg.connect(settings.pg_dsn, autocommit=True)
    try:
        embedding.execute(f"SET search_path TO {settings.pg_schema}, public")
        with embedding.transaction():  # an embedder claims the old version and computes its vector ...
            claimed = claim(embedding, 10)
            assert [c["version_id"] for c in claimed] == [old.version_id]
            made = dict(
                zip(
                    [old.version_id],
                    Embedders(settings, embedder).vectors([embedding_text_for(claimed[0]["row"])]),
                    strict=True,
                )
            )
            # ... while the projection supersedes it and an indexer writes that
            new = _port(ledger, 9090, T0 + timedelta(days=1))
            assert drain_once(settings, conn, es, refresh=True) == 2
            assert _doc(es, settings, old.version_id)["status"] == "superseded"
            stats = complete(settings, embedding, claimed, made)
            assert stats.stored == 1
    finally:
        embedding.close()
    drain_all(settings, conn, es, embedder)
    doc = _doc(es, settings, old.version_id)
    assert doc["status"] == "superseded" and doc["superseded_by"] == new.version_id  # the vector landed ...
    assert doc["embedding"] and doc["embed_model"]  # ... on the superseded document, which stays superseded
    assert _doc(es, settings, new.version_id)["status"] == "active"


def test_a_stale_document_write_is_refused_by_its_revision(store, embedder):
    """Two indexers read the same version at two moments; the one that read first writes last: refused (409)."""
    settings, conn, es, ledger = store
    old = _port(ledger, 8080, T0)
    drain_all(settings, conn, es, embedder)
    stale = read_rows(conn, [old.version_id])[old.version_id]  # indexer A reads ...
    _port(ledger, 9090, T0 + timedelta(days=1))  # ... the version is superseded ...
    drain_all(settings, conn, es, embedder)  # ... and indexer B writes the newer state
    fresh = read_rows(conn, [old.version_id])[old.version_id]
    assert fresh["rev"] > stale["rev"]
    [(ok, info)] = _bulk(es, [doc_action(settings, settings.es_index, stale)], refresh=True)  # A writes late
    assert not ok and info["index"]["status"] == 409
    assert _doc(es, settings, old.version_id)["status"] == "superseded"
    [(ok, _)] = _bulk(es, [doc_action(settings, settings.es_index, fresh)], refresh=True)  # a redo: same revision
    assert ok


def test_two_indexers_and_two_embedders_never_claim_the_same_rows(store, embedder):
    settings, conn, es, ledger = store
    for i in range(6):
        ledger.assert_fact(TENANT, f"s:{i}", f"k.{i}", f"fact number {i} about claims")
    other = psycopg.connect(settings.pg_dsn, autocommit=True)
    try:
        other.execute(f"SET search_path TO {settings.pg_schema}, public")
        with other.transaction():  # indexer A holds two rows (mid-batch) ...
            held = other.execute("SELECT id FROM search_outbox ORDER BY id LIMIT 2 FOR UPDATE SKIP LOCKED").fetchall()
            stats = DrainStats()
            assert drain_once(settings, conn, es, refresh=True, stats=stats) == 4  # ... B takes the other four
            assert outbox_count(conn) == 2
            assert {r[0] for r in conn.execute("SELECT id FROM search_outbox")} == {r[0] for r in held}
        assert drain_once(settings, conn, es, refresh=True) == 2  # A died (rolled back): B finishes
        assert embed_queue_count(conn) == 6
        with other.transaction():
            held = claim(other, 3)  # embedder A holds three ...
            done = embed_once(settings, conn, embedder, batch_size=10)  # ... B embeds the other three
            assert done.claimed == 3 and done.stored == 3
            assert {c["version_id"] for c in held}.isdisjoint(
                {r[0] for r in conn.execute("SELECT version_id FROM version_vectors")}
            )
        assert embed_once(settings, conn, embedder, batch_size=10).stored == 3  # A died: B finishes
    finally:
        other.close()
    drain_all(settings, conn, es, embedder)
    assert embed_queue_count(conn) == 0 and outbox_count(conn) == 0
    assert es.count(index=settings.es_index)["count"] == 6
    assert conn.execute("SELECT count(DISTINCT version_id) FROM version_vectors").fetchone()[0] == 6


def test_one_tenants_backlog_holds_another_tenants_new_version_back_one_batch_at_most(store):
    """A tenant's backlog of vectors, then another tenant's one new version: the next batch holds that version
    beside the backlog's oldest rows (shared among the tenants waiting, the longest waiting first; what a share
    leaves goes to the oldest rows of any tenant), not after the whole backlog."""
    settings, conn, es, ledger = store
    written = [ledger.assert_fact(TENANT, f"busy:{i}", f"k.{i}", f"a busy tenant's fact {i}") for i in range(12)]
    quiet = ledger.assert_fact("twophase-quiet", "q:1", "k.1", "the quiet tenant's one fact")
    assert drain_once(settings, conn, es) == 13
    queued = [r[0] for r in conn.execute("SELECT version_id FROM embed_queue ORDER BY id")]
    busy = [w.version_id for w in written]
    assert queued == [*busy, quiet.version_id]  # the queue's order is the writers' (not the version ids')
    with conn.transaction():
        batch = [c["version_id"] for c in claim(conn, 4)]
        raise psycopg.Rollback()
    assert sorted(batch) == sorted([*busy[:3], quiet.version_id]), batch  # shares 2 + 2, the quiet one's unused
    with conn.transaction():
        assert sorted(c["version_id"] for c in claim(conn, 1)) == [busy[0]]  # one row: the longest waiting tenant's
        raise psycopg.Rollback()


def test_one_tenants_backlog_holds_another_tenants_new_document_back_one_batch_at_most(store):
    """The indexers' side of the same: a tenant's backlog of new documents, then another tenant's one new version:
    the next batch indexes that version's document (the batch shared among the tenants waiting), not after the
    whole backlog."""
    settings, conn, es, ledger = store
    for i in range(12):
        ledger.assert_fact(TENANT, f"busy:{i}", f"k.{i}", f"a busy tenant's fact {i}")
    quiet = ledger.assert_fact("twophase-quiet", "q:1", "k.1", "the quiet tenant's one fact")
    assert drain_once(settings, conn, es, batch_size=4, refresh=True) == 4
    assert es.exists(index=settings.es_index, id=quiet.version_id)
    assert outbox_count(conn) == 9  # the busy tenant's nine newest


def test_new_documents_are_claimed_alone_before_small_batches_of_vector_rewrites(store, embedder):
    """A batch holds one kind of row: every new version's document first, then, only when
    none waits, the embedders' rewrites, at most indexer_rewrite_batch_size of them (the claim split)."""
    settings, conn, es, ledger = store
    settings = settings.model_copy(update={"indexer_rewrite_batch_size": 2})
    for i in range(5):
        ledger.assert_fact(TENANT, f"r:{i}", f"k.{i}", f"fact number {i} about batches")
    assert drain_once(settings, conn, es) == 5  # the documents, no vectors yet
    assert embed_once(settings, conn, embedder, batch_size=10).stored == 5  # five rewrites queued (priority 1)
    for i in range(3):
        ledger.assert_fact(TENANT, f"n:{i}", f"k.{i}", f"a newer fact {i} about batches")  # three new (priority 0)

    def priorities() -> list[int]:
        return sorted(r[0] for r in conn.execute("SELECT priority FROM search_outbox"))

    assert priorities() == [0, 0, 0, 1, 1, 1, 1, 1]
    first = DrainStats()
    assert drain_once(settings, conn, es, batch_size=500, stats=first) == 3  # the new ones alone, all of them
    assert (first.first_writes, first.limit) == (3, 500) and priorities() == [1] * 5
    rewrites = DrainStats()
    assert drain_once(settings, conn, es, batch_size=500, stats=rewrites) == 2  # then two rewrites at a time
    assert (rewrites.first_writes, rewrites.limit) == (0, 2) and priorities() == [1] * 3
    ledger.assert_fact(TENANT, "n:9", "k.9", "one more new fact about batches")
    assert drain_once(settings, conn, es, batch_size=500) == 1  # a new one jumps the remaining rewrites
    assert priorities() == [1] * 3
    drain_all(settings, conn, es, embedder)
    assert es.count(index=settings.es_index)["count"] == 9


def test_an_erasure_during_an_embedding_stores_nothing(store, embedder):
    settings, conn, es, ledger = store
    gone = _port(ledger, 8080, T0, subject="project:gone")
    keep = _port(ledger, 8081, T0, subject="project:keep")
    drain_once(settings, conn, es, refresh=True)
    embedding = psycopg.connect(settings.pg_dsn, autocommit=True)
    try:
        embedding.execute(f"SET search_path TO {settings.pg_schema}, public")
        with embedding.transaction():
            claimed = claim(embedding, 10)
            texts = [embedding_text_for(c["row"]) for c in claimed]
            made = {
                c["version_id"]: v for c, v in zip(claimed, Embedders(settings, embedder).vectors(texts), strict=True)
            }
            ledger.publish(MemoryEvent(type=EventType.ERASED, tenant=TENANT, subject="project:gone"))
            stats = complete(settings, embedding, claimed, made)
            assert stats.stored == 1  # the erased version's row is gone: nothing stored for it
    finally:
        embedding.close()
    drain_all(settings, conn, es, embedder)
    stored = {r[0] for r in conn.execute("SELECT version_id FROM version_vectors")}
    assert stored == {keep.version_id}
    assert not es.exists(index=settings.es_index, id=gone.version_id)
    assert embed_queue_count(conn) == 0


def test_an_erasure_after_the_vectors_deletes_them_with_the_version(store, embedder):
    settings, conn, es, ledger = store
    gone = _port(ledger, 8080, T0, subject="project:gone")
    drain_all(settings, conn, es, embedder)
    assert conn.execute("SELECT count(*) FROM version_vectors WHERE version_id = %s", (gone.version_id,)).fetchone()[0]
    ledger.publish(MemoryEvent(type=EventType.ERASED, tenant=TENANT, subject="project:gone"))
    drain_all(settings, conn, es, embedder)
    assert conn.execute("SELECT count(*) FROM version_vectors").fetchone()[0] == 0
    assert es.count(index=settings.es_index)["count"] == 0


@pytest.mark.unit
def test_vectors_made_before_elasticsearch_failed_are_not_made_again(store, embedder):
    """An episode's near-duplicate look-up asks Elasticsearch after the embedding: when it failed, the batch rolled
    back and its vectors were thrown away, so each retry while Elasticsearch was away embedded the batch again. They
    wait in the cache; the retry embeds nothing."""
    from projections.search.client import es_client
    from tests.support import episode
    from tests.test_cli_store_errors import dead_port

    settings, conn, es, ledger = store
    ledger.apply(episode("user:ep", "we met at the harbour cafe at noon", T0, "chat", tenant=TENANT))
    drain_once(settings, conn, es, refresh=True)
    made: list[int] = []

    class Counting:
        def __getattr__(self, name):
            return getattr(embedder, name)

        def embed(self, texts, *args, **kwargs):
            made.append(len(texts))
            return embedder.embed(texts, *args, **kwargs)

    cache: dict = {}
    away = es_client(f"http://127.0.0.1:{dead_port()}", request_timeout=2)
    with pytest.raises(Exception):  # noqa: B017 - whichever error the client raises for a refused port
        embed_once(settings, conn, Counting(), cache=cache, es=away)
    assert made and cache and embed_queue_count(conn) == 1, (made, cache)
    first = len(made)
    done = embed_once(settings, conn, Counting(), cache=cache, es=es)
    assert done.stored == 1 and len(made) == first and not cache, (done, made)


def test_vectors_pack_to_float32_and_back():
    from projections.search.vectors import pack

    v = [0.5, -0.25, 1.0, 0.0, 1e-7]
    assert unpack(pack(v)) == pytest.approx(v, rel=1e-6)
    assert len(pack([0.0] * 384)) == 384 * 4


@pytest.mark.unit
def test_a_search_stage_started_in_its_own_session_lowers_that_session_too():
    """A nice value ranks a process only within its session's autogroup, where a service started by infra.procs is
    alone: the stage lowers its autogroup too, or the kernel weighs it as much as the worker's session."""
    code = (
        "import os; from projections.search.drain import lower_priority; lower_priority(7); "
        "print(os.getpriority(os.PRIO_PROCESS, 0)); print(open('/proc/self/autogroup').read().strip())"
    )
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("no autogroups on this kernel")
    started = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True, start_new_session=True
    )
    nice, autogroup = started.stdout.splitlines()
    assert int(nice) == min(os.getpriority(os.PRIO_PROCESS, 0) + 7, 19)
    assert autogroup.endswith("nice 7"), autogroup

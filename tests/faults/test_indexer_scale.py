"""Scale-out: two indexers and two embedders share a stream; one of each is killed with `kill -9`.

A publisher thread streams N_EVENTS events (new facts, supersessions, English and Chinese text) through the SDK
while a worker projects them and two `ledger indexer` and two `ledger embedder` processes drain the outbox and the
embed queue. Once both kinds have done part of the work, one indexer and one embedder are SIGKILLed in mid-batch
(their claims roll back with their connections) and a `ledger reindex` switches the alias with the survivors
running. Then the survivors must finish everything: every version a document with exactly its configured
vectors, no document without a version (orphans 0), nothing doubled, queues and their counters at 0.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter

import psycopg
from elasticsearch import Elasticsearch
from elasticsearch.helpers import scan

from producers.contract import MemoryEvent
from producers.sdk import LedgerProducer
from producers.settings import REPO_ROOT
from projections.languages import vector_plan
from projections.search.documents import embedding_text_for
from projections.search.indexer import read_rows
from projections.search.mapping import physical_indices
from projections.search.reindex import orphans
from tests.conftest import unique
from tests.faults.support import TALLY
from tests.support import Embedder, Indexer, Worker, asserted, cleanup, search_pending, wait_caught_up, wait_for

N_EVENTS = 1_200
TENANT = "scaleout"
TEXTS = [
    "Ann adopted a grey kitten named {i}",
    "The {i} service moved to the new cluster",
    "用户 {i} 喜欢靠窗的座位",
    "项目 {i} 的后端服务端口是 8080",
]


def _events() -> list[MemoryEvent]:
    """New facts over 400 subjects; every third one supersedes its subject's earlier fact (a new version)."""
    out = []
    for i in range(N_EVENTS):
        subject = f"s:{i % 400}"
        out.append(
            asserted(subject, "topic.note", i, i // 400, tenant=TENANT, content=TEXTS[i % len(TEXTS)].format(i=i))
        )
    return out


def _progress(conn: psycopg.Connection) -> tuple[int, int, int]:
    """(documents written once, versions with vectors, versions) so far."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM fact_versions) - (SELECT count(*) FROM search_outbox), "
        "(SELECT count(DISTINCT version_id) FROM version_vectors), (SELECT count(*) FROM fact_versions)"
    ).fetchone()
    return row  # type: ignore[return-value]


def test_two_indexers_and_two_embedders_survive_a_kill_of_one_of_each(base_settings):
    settings = base_settings.private(unique("scale"))
    procs = []
    try:
        worker = Worker(settings).start()
        indexers = [Indexer(settings).start(), Indexer(settings).start()]
        embedders = [Embedder(settings, embedder_batch_size=16).start(), Embedder(settings, embedder_batch_size=16)]
        embedders[1].start()
        procs = [worker, *indexers, *embedders]
        events = _events()
        published: list = []

        def publish() -> None:
            with LedgerProducer(settings) as producer:
                for k in range(0, len(events), 100):
                    published.extend(producer.publish_many(events[k : k + 100]))
                    time.sleep(0.2)

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        conn = psycopg.connect(settings.pg_dsn, autocommit=True)
        wait_for(
            lambda: conn.execute("SELECT to_regclass(%s)", (f"{settings.pg_schema}.version_vectors",)).fetchone()[0],
            60,
            0.2,
            "the schema",
        )
        conn.execute(f"SET search_path TO {settings.pg_schema}, public")
        # both stages part-way through: then one of each dies mid-batch
        wait_for(lambda: (p := _progress(conn))[0] >= 200 and p[1] >= 60, 180, 0.1, "part of the work done")
        before = _progress(conn)
        indexers[0].kill()
        embedders[0].kill()
        # a reindex with the survivors running (it copies stored vectors, queues the rest)
        reindex = subprocess.run(
            [sys.executable, "-m", "infra.cli", "reindex", "--no-embed"],
            cwd=REPO_ROOT,
            env=settings.child_environ(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert reindex.returncode == 0, reindex.stdout[-2000:] + reindex.stderr[-2000:]
        publisher.join(timeout=300)
        assert not publisher.is_alive() and len(published) == N_EVENTS
        wait_caught_up(settings, timeout=180, worker=worker)
        started = time.monotonic()
        wait_for(lambda: search_pending(conn) == 0, 600, 0.5, "the survivors to finish")
        TALLY.timings_s["scale-out: survivors finished after the kills"] = round(time.monotonic() - started, 1)
        TALLY.add(faults_injected=2, events_injected=N_EVENTS)
        for p in (indexers[1], embedders[1], worker):
            p.check()  # the survivors never died

        es = Elasticsearch(settings.es_url, request_timeout=60)
        es.indices.refresh(index=settings.es_index)
        [physical] = physical_indices(es, settings.es_index)  # the reindex switched the alias; the old one gone
        assert settings.es_index in reindex.stdout and physical in reindex.stdout
        report = orphans(settings, conn, es)
        assert (report["missing_in_es"], report["missing_in_pg"], report["outbox_pending"]) == (0, 0, 0), report
        versions = [r[0] for r in conn.execute("SELECT version_id FROM fact_versions")]
        assert len(versions) == N_EVENTS  # one version per event, none doubled
        assert report["es_documents"] == len(versions)
        rows = read_rows(conn, versions)
        docs = {
            h["_id"]: h["_source"]
            for h in scan(
                es, index=settings.es_index, query={"query": {"match_all": {}}}, _source=["embed_model", "status"]
            )
        }
        for vid, row in rows.items():  # every document has exactly its version's configured vectors and status
            plan = vector_plan(settings, embedding_text_for(row))
            assert docs[vid]["embed_model"] == [m for _, m in plan], vid
            assert docs[vid]["status"] == row["status"], vid
            assert sorted(zip(row["vec_fields"], row["vec_models"], strict=True)) == sorted(plan), vid
        statuses = Counter(r["status"] for r in rows.values())
        assert statuses["superseded"] == N_EVENTS - 400 and statuses["active"] == 400
        counters = dict(
            conn.execute(
                "SELECT name, sum(n) FROM counts WHERE name IN ('outbox', 'embed_queue') GROUP BY name"
            ).fetchall()
        )
        assert counters == {"outbox": 0, "embed_queue": 0}
        TALLY.notes.append(
            f"scale-out: one indexer and one embedder killed after {before[0]} documents and {before[1]} versions "
            f"with vectors (of {before[2]} versions then); the survivors finished, orphans 0"
        )
        es.close()
        conn.close()
    finally:
        for p in procs:
            p.kill()
        cleanup(settings)

"""Prometheus metrics: every process counts a real ingest by exactly what happened.

A worker and an indexer run as child processes with metrics ports of their own; the API runs in this process
(its /metrics is scraped through the app, like Prometheus would, without a key). One known ingest: N valid
events, one redelivered duplicate, one record that is not JSON. Each process is scraped before and after, and
each counter must have moved by exactly what the ingest did. The consumer lag and the outbox gauges are seen
both non-zero (the worker's position rows and the indexer's advisory lock are held by the test meanwhile) and
back at zero. The route labelling is a unit test: a raw subject never becomes a label. `ledger serve --workers 2`
answers every scrape with the sum of both processes (multiprocess mode).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import PlainTextResponse
from starlette.routing import Mount

from api.metrics import UNMATCHED
from api.metrics import install as install_metrics
from infra.private import free_port
from producers.contract import encode
from producers.metrics import counter, histogram
from producers.settings import REPO_ROOT, Settings
from producers.topics import ensure_topics
from projections.search.indexer import lock_key
from tests.support import (
    TENANT,
    Embedder,
    Indexer,
    Worker,
    asserted,
    cleanup,
    pg,
    publish_raw,
    wait_caught_up,
    wait_for,
)

H = {"X-API-Key": "dev-key"}
N = 5  # valid events of the ingest
M = 3  # events published while the worker cannot commit (consumer lag)
K = 3  # recalls through the API
SECRET_SUBJECT = "user:metrics-secret-4711"  # must never appear in any label

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, by (sample name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(url: str) -> Samples:
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200, r.text
    return parse(r.text)


def up(url: str, process) -> Samples | None:
    process.check()
    try:
        return scrape(url)
    except httpx.TransportError:
        return None


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def lags(samples: Samples, topic: str) -> dict[int, float]:
    return {
        int(dict(labels)["partition"]): v
        for (name, labels), v in samples.items()
        if name == "ledger_worker_consumer_lag" and dict(labels)["topic"] == topic
    }


def lag_shows(url: str, topic: str, late: Counter[int]) -> None:
    """Wait until the exporter at `url` shows `topic`'s lag as the records `late` (partition -> count) make it."""
    total = sum(late.values())
    waiting = wait_for(
        lambda: (lag := lags(scrape(url), topic)) and sum(lag.values()) == total and lag,
        30,
        0.3,
        f"a consumer lag of {total} on {topic}",
    )
    assert {p: v for p, v in waiting.items() if v} == dict(late)


# -- unit: names and route templates -------------------------------------------------------------------------------


@pytest.mark.unit
def test_family_names_follow_the_conventions() -> None:
    with pytest.raises(ValueError, match="_total"):
        counter("metrics_test_things", "a counter without _total")
    with pytest.raises(ValueError, match="prefix"):
        histogram("ledger_metrics_test_seconds", "the prefix given twice")


@pytest.mark.unit
def test_requests_are_labelled_by_route_template_never_by_raw_path(base_settings: Settings) -> None:
    """Included routers (prefixes at two levels), a route and a mount of the app, a 405, a 404, an odd method."""
    facts = APIRouter()

    @facts.get("/subjects/{subject}/facts")
    async def subject_facts(subject: str) -> dict:
        return {"subject": subject}

    v1 = APIRouter()
    v1.include_router(facts, prefix="/tenants")
    app = FastAPI()
    app.include_router(v1, prefix="/v1")
    app.add_route("/plain/{name}", lambda request: PlainTextResponse("ok"))
    app.router.routes.append(
        Mount("/assets", app=lambda scope, receive, send: PlainTextResponse("a")(scope, receive, send))
    )
    install_metrics(app, base_settings)

    with TestClient(app) as client:
        before = parse(client.get(base_settings.api_metrics_path).text)
        assert client.get(f"/v1/tenants/subjects/{SECRET_SUBJECT}/facts").status_code == 200
        assert client.get(f"/v1/tenants/subjects/{SECRET_SUBJECT}x/facts").status_code == 200
        assert client.post(f"/v1/tenants/subjects/{SECRET_SUBJECT}/facts").status_code == 405
        assert client.get(f"/plain/{SECRET_SUBJECT}").status_code == 200
        assert client.get(f"/assets/{SECRET_SUBJECT}.js").status_code == 200
        assert client.get(f"/nowhere/{SECRET_SUBJECT}").status_code == 404
        assert client.request("BREW", f"/v1/tenants/subjects/{SECRET_SUBJECT}/facts").status_code == 405
        text = client.get(base_settings.api_metrics_path).text

    after = parse(text)
    assert "secret" not in text  # neither in a label nor anywhere else
    total = "ledger_http_requests_total"
    assert delta(after, before, total, method="GET", route="/v1/tenants/subjects/{subject}/facts", status="200") == 2
    assert delta(after, before, total, method="POST", route="/v1/tenants/subjects/{subject}/facts", status="405") == 1
    assert delta(after, before, total, method="other", route="/v1/tenants/subjects/{subject}/facts", status="405") == 1
    assert delta(after, before, total, method="GET", route="/plain/{name}", status="200") == 1
    assert delta(after, before, total, method="GET", route="/assets/{path}", status="200") == 1
    assert delta(after, before, total, method="GET", route=UNMATCHED, status="404") == 1
    assert delta(after, before, total, method="GET", route="/metrics", status="200") == 1  # the first scrape
    seconds = "ledger_http_request_duration_seconds_count"
    assert delta(after, before, seconds, method="GET", route="/v1/tenants/subjects/{subject}/facts") == 2


# -- the whole ledger ------------------------------------------------------------------------------------------------


@pytest.fixture
def metered(settings: Settings) -> Iterator[Settings]:
    """Private settings with free metrics ports and gauges refreshed twice a second; cleaned up afterwards."""
    s = settings.model_copy(
        update={
            "worker_metrics_port": free_port(),
            "indexer_metrics_port": free_port(),
            "embedder_metrics_port": free_port(),
            "metrics_refresh_s": 0.5,
        }
    )
    try:
        ensure_topics(s)
        yield s
    finally:
        cleanup(s)


def test_every_process_counts_a_real_ingest_exactly(metered: Settings) -> None:
    s = metered
    worker_url = f"http://127.0.0.1:{s.worker_metrics_port}/metrics"
    indexer_url = f"http://127.0.0.1:{s.indexer_metrics_port}/metrics"
    events = [asserted(f"user:metrics-{i}", "pref.seat", f"seat {i}") for i in range(N)]

    with Worker(s) as worker:
        w0 = wait_for(lambda: up(worker_url, worker), 90, 0.3, "the worker's metrics")

        # N valid events, the first one again (a redelivery), a record that is not JSON
        records = [(e.kafka_key, encode(e)) for e in events]
        placed = publish_raw(s, [*records, records[0], (b"junk", b"{not json")])
        wait_caught_up(s, timeout=90, worker=worker)
        w1 = wait_for(
            lambda: (
                (w := scrape(worker_url))
                and delta(w, w0, "ledger_worker_records_total", outcome="dead_letter") == 1
                and delta(w, w0, "ledger_worker_records_total", outcome="applied") >= N
                and w
            ),
            30,
            0.2,
            "the worker's counters",
        )
        assert delta(w1, w0, "ledger_worker_records_total", outcome="applied") == N
        assert delta(w1, w0, "ledger_worker_records_total", outcome="duplicate") == 1
        assert delta(w1, w0, "ledger_worker_records_total", outcome="skipped") == 0
        assert delta(w1, w0, "ledger_worker_dead_letters_total", reason="bad_json") == 1
        assert sum(v for (name, _), v in w1.items() if name == "ledger_worker_dead_letters_total") == 1
        assert delta(w1, w0, "ledger_worker_batch_duration_seconds_count") >= 1
        assert delta(w1, w0, "ledger_worker_batch_duration_seconds_sum") > 0
        touched = {p for p, _ in placed}
        wait_for(lambda: all(lags(scrape(worker_url), s.topic).get(p) == 0 for p in touched), 30, 0.3, "lag 0")

        # the worker cannot commit while the test holds its position rows: the lag shows what waits
        more = [asserted(f"user:metrics-{i}", "pref.meal", f"meal {i}") for i in range(M)]
        with pg(s) as conn, conn.transaction():
            conn.execute(
                'SELECT * FROM positions WHERE consumer = %s AND topic = %s AND "partition" = ANY(%s) FOR UPDATE',
                (s.processor_group, s.topic, sorted(touched)),
            )
            late = Counter(p for p, _ in publish_raw(s, [(e.kafka_key, encode(e)) for e in more]))
            assert set(late) <= touched  # same subjects, same partitions
            lag_shows(worker_url, s.topic, late)
        wait_caught_up(s, timeout=90, worker=worker)
        wait_for(lambda: sum(lags(scrape(worker_url), s.topic).values()) == 0, 30, 0.3, "lag back to 0")

        # the access topic's agent has its lag too (records it cannot commit: no access position row exists yet to
        # hold, so the table is; invalid records are dead letters once applied, as good as any for a lag)
        with pg(s) as conn, conn.transaction():
            conn.execute("LOCK TABLE positions IN SHARE MODE")
            late = Counter(p for p, _ in publish_raw(s, [(b"acme|x", b"{}")] * M, topic=s.access_topic))
            lag_shows(worker_url, s.access_topic, late)
        wait_for(lambda: sum(lags(scrape(worker_url), s.access_topic).values()) == 0, 30, 0.3, "access lag back to 0")
        w2 = scrape(worker_url)
        assert delta(w2, w0, "ledger_worker_records_total", outcome="applied") == N + M
        worker.check()

    # the indexer cannot drain while the test holds the reindex lock: the outbox gauge shows what waits
    embedder_url = f"http://127.0.0.1:{s.embedder_metrics_port}/metrics"
    with psycopg.connect(s.pg_dsn, autocommit=True) as locker:
        assert locker.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (lock_key(s),)).fetchone()[0]
        with Indexer(s) as indexer:
            i0 = wait_for(
                lambda: (
                    (i := up(indexer_url, indexer))
                    and value(i, "ledger_indexer_outbox_depth") == N + M
                    and value(i, "ledger_indexer_vectors_pending") == 0
                    and i
                ),
                120,
                0.3,
                f"an outbox depth of {N + M}",
            )
            assert value(i0, "ledger_indexer_documents_total", op="index") == 0
            locker.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (lock_key(s),))
            # documents first, without vectors: they wait in the embed queue (no embedder runs yet)
            i1 = wait_for(
                lambda: (
                    (i := scrape(indexer_url))
                    and value(i, "ledger_indexer_outbox_depth") == 0
                    and value(i, "ledger_indexer_vectors_pending") == N + M
                    and delta(i, i0, "ledger_indexer_documents_total", op="index") >= N + M
                    and i
                ),
                60,
                0.3,
                "the outbox drained into documents without vectors",
            )
            assert delta(i1, i0, "ledger_indexer_documents_total", op="index") == N + M
            assert delta(i1, i0, "ledger_indexer_outbox_rows_total") == N + M
            assert delta(i1, i0, "ledger_indexer_failed_documents_total") == 0
            assert delta(i1, i0, "ledger_indexer_batch_duration_seconds_count") >= 1
            with Embedder(s) as embedder:
                e1 = wait_for(
                    lambda: (
                        (e := up(embedder_url, embedder))
                        and value(e, "ledger_embedder_queue_depth") == 0
                        and value(e, "ledger_embedder_versions_total", outcome="stored") == N + M
                        and e
                    ),
                    180,
                    0.5,
                    "the embedder's queue drained",
                )
                assert value(e1, "ledger_embedder_versions_total", outcome="gone") == 0
                assert value(e1, "ledger_embedder_texts_total") >= N + M  # English text: two models each
                assert value(e1, "ledger_embedder_embedding_duration_seconds_count") >= 1
                assert value(e1, "ledger_embedder_oldest_pending_seconds") == 0
                embedder.check()
            # each document once more, now with its vectors
            i2 = wait_for(
                lambda: (
                    (i := scrape(indexer_url))
                    and value(i, "ledger_indexer_vectors_pending") == 0
                    and value(i, "ledger_indexer_outbox_depth") == 0
                    and delta(i, i0, "ledger_indexer_documents_total", op="index") >= 2 * (N + M)
                    and i
                ),
                60,
                0.3,
                "the documents rewritten with their vectors",
            )
            assert delta(i2, i0, "ledger_indexer_documents_total", op="index") == 2 * (N + M)
            assert delta(i2, i0, "ledger_indexer_documents_total", op="update") == 0
            indexer.check()

    # the API: K recalls, one refused, one read of a subject's facts; /metrics needs no key
    from api.main import create_app

    with TestClient(create_app(s)) as client:
        a0 = parse(client.get(s.api_metrics_path).text)
        for i in range(K):
            r = client.post("/v1/recall", headers=H, json={"tenant": TENANT, "query": f"user:metrics-{i} seat"})
            assert r.status_code == 200, r.text
        assert client.post("/v1/recall", headers=H, json={"tenant": "intruder", "query": "seat"}).status_code == 403
        assert (
            client.get(f"/v1/subjects/{SECRET_SUBJECT}/facts", headers=H, params={"tenant": TENANT}).status_code == 200
        )
        r = client.get(s.api_metrics_path)  # no key
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        a1 = parse(r.text)

    assert "secret" not in r.text
    total = "ledger_http_requests_total"
    assert delta(a1, a0, total, method="POST", route="/v1/recall", status="200") == K
    assert delta(a1, a0, total, method="POST", route="/v1/recall", status="403") == 1
    assert delta(a1, a0, total, method="GET", route="/v1/subjects/{subject}/facts", status="200") == 1
    assert delta(a1, a0, "ledger_http_request_duration_seconds_count", method="POST", route="/v1/recall") == K + 1
    # every recall extracts cues and ranks once; the refused one never reached the engine
    assert delta(a1, a0, "ledger_recall_stage_duration_seconds_count", stage="cues") == K
    assert delta(a1, a0, "ledger_recall_stage_duration_seconds_count", stage="rerank") == K
    assert delta(a1, a0, "ledger_recall_stage_duration_seconds_sum", stage="cues") > 0


def test_several_uvicorn_processes_answer_with_their_sum(settings: Settings) -> None:
    """`ledger serve --workers 2`: whichever process answers a scrape, it counts the requests of both."""
    port = free_port()
    requests = 30
    env = settings.child_environ(api_port=port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "serve", "--workers", "2"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    directory = settings.data_dir / "metrics" / f"api-{port}"

    def health() -> bool:
        assert proc.poll() is None, f"ledger serve exited with {proc.returncode}"
        try:
            return httpx.get(f"{url}/v1/health", timeout=10).status_code == 200
        except httpx.TransportError:
            return False

    def answered(samples: Samples) -> float:
        return value(samples, "ledger_http_requests_total", method="GET", route="/v1/health", status="200")

    try:
        wait_for(health, 120, 0.3, "ledger serve --workers 2")
        before = scrape(f"{url}{settings.api_metrics_path}")
        for _ in range(requests):  # a connection each: the kernel hands them to either process
            with httpx.Client(timeout=10) as c:
                assert c.get(f"{url}/v1/health").status_code == 200
        # each process's own file: both answered some of them (else one process's count would be the sum too)
        per_process = {
            f.name: sum(
                s.value
                for family in MultiProcessCollector.merge([str(f)], accumulate=False)
                for s in family.samples
                if s.name == "ledger_http_requests_total" and s.labels.get("route") == "/v1/health"
            )
            for f in directory.glob("counter_*.db")
        }
        assert len(per_process) == 2 and all(per_process.values()), per_process
        for _ in range(6):
            with httpx.Client(timeout=10) as c:
                after = parse(c.get(f"{url}{settings.api_metrics_path}").text)
            assert answered(after) - answered(before) == requests
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(directory, ignore_errors=True)

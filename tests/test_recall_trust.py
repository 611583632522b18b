"""Recall under hostile input and after erasure, against the real servers and a real uvicorn server.

- long adversarial queries (2,000 characters) return 200 while `/v1/health`, sent meanwhile to the
  same server, answers within 100 ms: cue extraction is linear and runs off the event loop.
- an erasure's NOTIFY (sent by the recorder in the erasure transaction) drops the tenant's cached
  vocabulary, so the first recall after it names neither the erased entity nor its key aliases; the LISTEN
  connection comes back after it is cut.
- "the last 0 days" (and out-of-range numbers) through the API: no time filter, not an inverted range.

Facts go through the real PostgreSQL projection (`tests.support.RecorderWriter`) and the indexer. The load test
runs the API as `uvicorn api.main:app` in a subprocess (its own GIL, as deployed); the other tests serve
`create_app(settings)` by uvicorn in a thread of this process, so they can watch its erasure listener.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from asyncio import run
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
import uvicorn

from api.main import create_app
from producers.contract import EventType, MemoryEvent
from projections.embedding import load_embedder
from projections.search.recall import RecallEngine
from projections.search.vocab import ERASURE_CHANNEL, VocabularyCache
from tests.conftest import unique
from tests.support import RecorderWriter as Ledger
from tests.support import async_pool, drain_all, private_store, wait_for
from tests.test_cues import HOSTILE as CUE_SHAPES

TENANT, OTHER = "trustco", "otherco"
KEY, OTHER_KEY = "k-trust", "k-other"
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
HEALTH_BOUND_S = 0.100


class ThreadServer:
    """uvicorn serving `app` on a free loopback port, in a daemon thread (signals stay with pytest)."""

    def __init__(self, app) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=30, what="uvicorn to start")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@pytest.fixture(scope="module")
def world(base_settings):
    settings = base_settings.private(unique("rt"), api_keys={KEY: [TENANT], OTHER_KEY: [OTHER]})
    embedder = load_embedder(settings)
    with private_store(settings) as (conn, es):
        ledger = Ledger(settings, conn)
        facts = {
            "port": ledger.assert_fact(
                TENANT,
                "project:P1",
                "project.backend_port",
                "P1 的后端服务端口是 8080",
                8080,
                aliases=["端口", "backend port"],
                entities=["P1"],
                valid_from=T0,
            ),
            "refund": ledger.assert_fact(
                TENANT,
                "order:OD5001",
                "order.refund",
                "订单 OD5001 已退款，退款金额 30 元",
                30,
                kind="event",
                entities=["OD5001"],
                valid_from=datetime.now(UTC) - timedelta(days=1),
            ),
        }
        drain_all(settings, conn, es, embedder)
        app = create_app(settings)
        with ThreadServer(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
            yield {
                "settings": settings,
                "conn": conn,
                "es": es,
                "ledger": ledger,
                "embedder": embedder,
                "app": app,
                "client": client,
                "facts": facts,
            }
        ledger.close()


@pytest.fixture(scope="module")
def api_process(world):
    """`uvicorn api.main:app` in a child process on the module's private settings; its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = world["settings"].child_environ(api_keys=json.dumps(world["settings"].api_keys))
    cmd = [sys.executable, "-m", "uvicorn", "api.main:app", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], env=env)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"the API exited with {proc.returncode}"
        try:
            return httpx.get(f"{url}/v1/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, timeout=60, interval=0.2, what="the API subprocess")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def recall(world, query: str, tenant: str = TENANT, key: str = KEY, **body) -> dict:
    r = world["client"].post("/v1/recall", json={"tenant": tenant, "query": query, **body}, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    return r.json()


def engine(world) -> RecallEngine:
    return world["app"].state.recall_engine


# --- a long hostile query never blocks the event loop ---------------------------------------------------


def _repeat(token: str, n: int = 2000) -> str:
    return (token * (n // len(token) + 1))[:n]


HOSTILE = [
    _repeat("P1 "),  # 13 s of extraction before the fix
    _repeat("user:42 "),
    _repeat("端"),
    _repeat("a b "),
    _repeat("P1 端口 port 昨天 user:7 αβγ "),
    " ".join(f"X{i}" for i in range(2000))[:2000],
]


def _hostile_load(api_process: str, queries: list[str], concurrency: int) -> list[float]:
    """Send `queries` `concurrency` at a time and poll /v1/health meanwhile; every recall must answer 200.

    Returns the health answer times of the round."""
    headers = {"X-API-Key": KEY}

    def long_recall(query: str) -> tuple[int, float]:
        with httpx.Client(base_url=api_process, timeout=60) as c:
            t0 = time.perf_counter()
            r = c.post("/v1/recall", json={"tenant": TENANT, "query": query}, headers=headers)
            return r.status_code, time.perf_counter() - t0

    with httpx.Client(base_url=api_process, timeout=60) as client:
        latencies: list[float] = []
        with ThreadPoolExecutor(concurrency) as pool:
            futures = [pool.submit(long_recall, q) for q in queries]
            while not all(f.done() for f in futures) or len(latencies) < 5:
                latencies.append(_health(client))
                time.sleep(0.02)
            results = [f.result() for f in futures]
    assert [status for status, _ in results] == [200] * len(results), results
    lat = sorted(latencies)
    print(
        f"\n{concurrency} at a time: recalls {[round(t * 1000) for _, t in results]} ms; health meanwhile "
        f"({len(lat)}x): p50 {lat[len(lat) // 2] * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms"
    )
    return latencies


def _health(client: httpx.Client) -> float:
    t0 = time.perf_counter()
    r = client.get("/v1/health")
    assert r.status_code == 200, r.text
    return time.perf_counter() - t0


def _assert_health_prompt(api_process: str, queries: list[str], concurrency: int, rounds: int = 3) -> None:
    """Every health answer of one round within HEALTH_BOUND_S; up to `rounds` rounds.

    The test machine (2 CPUs) is shared with other test runs (a worker, an indexer embedding batches): a round can
    be spoiled by another process taking the CPU for 100-200 ms. A blocked event loop spoils every round (before
    the fix: seconds per recall)."""
    with httpx.Client(base_url=api_process, timeout=60) as client:
        for q in queries:  # warm: the engine, the vocabulary, the embedding model, every code path
            r = client.post("/v1/recall", json={"tenant": TENANT, "query": q}, headers={"X-API-Key": KEY})
            assert r.status_code == 200, r.text
        _health(client)
    worst = []
    for _ in range(rounds):
        latencies = _hostile_load(api_process, queries, concurrency)
        if max(latencies) < HEALTH_BOUND_S:
            return
        worst.append([round(t * 1000) for t in sorted(latencies)[-3:]])
    raise AssertionError(f"a health answer took 100 ms or more in every round; slowest (ms): {worst}")


def test_health_answers_within_100_ms_while_a_long_hostile_recall_runs(api_process):
    """Before the fix one such recall spent ~6-13 s ON the event loop, and a concurrent health check waited as
    long. Each hostile shape in turn, one at a time: every health answer meanwhile within 100 ms."""
    _assert_health_prompt(api_process, HOSTILE, concurrency=1)


def test_health_answers_within_100_ms_while_a_few_hostile_recalls_run_at_once(api_process):
    """Three at a time, each shape twice: the embeddings of 2,000-character queries (~70 ms of CPU each) run off
    the loop at a lower priority, cue extraction in one worker, and no full garbage collection of the whole process
    stops the loop (the engine freezes the steady state once the model is loaded)."""
    _assert_health_prompt(api_process, HOSTILE * 2, concurrency=3)


def test_a_long_query_extracts_its_cues_off_the_loop_and_bounded(world):
    res = recall(world, HOSTILE[0], top_k=3)
    assert res["cues"]["entities"] == ["p1"] and res["cues"]["known_entities"] == ["p1"]
    assert res["trace"]["stages_ms"]["cues"] < 1000
    res = recall(world, HOSTILE[5])
    assert len(res["cues"]["entities"]) <= 32 and len(res["cues"]["terms"]) <= 64


# --- a time span of nothing is no filter ----------------------------------------------------------------


@pytest.mark.parametrize(
    "words",
    ["the last 0 days", "last 0 weeks", "past 0 hours", "最近0天", "过去0周", "the last 99999999999 days"],
)
def test_an_empty_or_huge_time_span_filters_nothing(world, words):
    res = recall(world, f"OD5001 {words} 退款了吗")
    assert res["cues"]["time"] is None, res["cues"]
    assert [h["memory_id"] for h in res["hits"]] == [world["facts"]["refund"].memory_id]


def test_a_real_time_span_still_filters(world):
    refund = world["facts"]["refund"].memory_id
    res = recall(world, "OD5001 the last 2 days 退款了吗")
    assert res["cues"]["time"] is not None and res["cues"]["time"]["from"] < res["cues"]["time"]["to"]
    assert [h["memory_id"] for h in res["hits"]] == [refund]
    assert recall(world, "OD5001 5 days ago 退款了吗")["hits"] == []  # it was refunded yesterday


# --- erasure drops the cached vocabulary at once ---------------------------------------------------------


def _erase(world, subject: str) -> None:
    """Through the real recorder: the erasure transaction purges the rows and runs pg_notify."""
    world["ledger"].publish(MemoryEvent(type=EventType.ERASED, tenant=TENANT, subject=subject))


def _zelda(world, entity: str = "Zelda", subject: str = "user:zelda") -> MemoryEvent:
    e = world["ledger"].assert_fact(
        TENANT,
        subject,
        f"preference.{entity.lower()}_seat",
        f"{entity} prefers the window seat",
        "window",
        aliases=[f"{entity.lower()} seat preference", f"{entity}的座位偏好"],
        entities=[entity],
        kind="preference",
        valid_from=T0,
    )
    drain_all(world["settings"], world["conn"], world["es"], world["embedder"])
    _forget_vocabulary(world)  # cached by an earlier test, before this fact: the next recall loads it afresh
    return e


def _forget_vocabulary(world) -> None:
    """Drop the server's cached vocabulary of the tenant, on the server's event loop (it owns the cache)."""
    vocab = engine(world).vocab
    loop = vocab.listener._task.get_loop()
    done = threading.Event()
    loop.call_soon_threadsafe(lambda: (vocab.invalidate(world["settings"].pg_schema, TENANT), done.set()))
    assert done.wait(5)


def _names(cues: dict, entity: str, key: str) -> bool:
    """Whether the cues name the entity (known or not), the subject, the key or one of its aliases."""
    named = {*cues["entities"], *cues["known_entities"]}
    return (
        entity in named
        or f"user:{entity}" in named
        or key in cues["keys"]
        or any(key in a["keys"] for a in cues["aliases"])
    )


def test_the_first_recall_after_an_erasure_names_nothing_erased(world):
    fact = _zelda(world)
    query = "what zelda seat preference does Zelda have"
    before = recall(world, query)  # the tenant's vocabulary is cached now, and knows zelda
    assert _names(before["cues"], "zelda", fact.key), before["cues"]
    assert [h["memory_id"] for h in before["hits"]] == [fact.memory_id]
    listener = engine(world).vocab.listener
    wait_for(lambda: listener.listening, timeout=5, what="the erasure listener")
    seen = listener.notifications

    _erase(world, "user:zelda")  # the index is NOT drained: its documents are still there
    wait_for(lambda: listener.notifications > seen, timeout=2, interval=0.01, what="the erasure notification")

    after = recall(world, query)  # the first one after the notification
    assert not _names(after["cues"], "zelda", fact.key), after["cues"]
    assert after["hits"] == [] or all(h["subject"] != "user:zelda" for h in after["hits"]), after["hits"]
    # the rest of the tenant's vocabulary is still there (reloaded, not emptied)
    assert "p1" in recall(world, "P1 backend port")["cues"]["known_entities"]


def test_an_erasure_in_another_tenant_keeps_this_tenants_vocabulary(world):
    vocab = engine(world).vocab
    recall(world, "P1 backend port")
    schema = world["settings"].pg_schema
    assert (schema, TENANT) in vocab._items
    listener = vocab.listener
    seen = listener.notifications
    with psycopg.connect(world["settings"].pg_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_notify(%s, json_build_object('schema', %s::text, 'tenant', %s::text, 'subject', 'x')::text)",
            (ERASURE_CHANNEL, schema, OTHER),
        )
    wait_for(lambda: listener.notifications > seen, timeout=2, interval=0.01, what="the notification")
    assert (schema, TENANT) in vocab._items


def test_the_listener_comes_back_after_its_connection_is_cut(world):
    fact = _zelda(world, "Yara", "user:yara")
    query = "what yara seat preference does Yara have"
    assert _names(recall(world, query)["cues"], "yara", fact.key)
    listener = engine(world).vocab.listener
    wait_for(lambda: listener.listening, timeout=5, what="the erasure listener")
    pid, connections, invalidations = listener.backend_pid, listener.connections, engine(world).vocab.invalidations
    with psycopg.connect(world["settings"].pg_dsn, autocommit=True) as conn:  # cut our own LISTEN session
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
    wait_for(lambda: listener.connections > connections, timeout=5, interval=0.01, what="the listener to reconnect")
    assert listener.backend_pid != pid
    assert engine(world).vocab.invalidations > invalidations  # what was sent while it was down is not lost

    assert _names(recall(world, query)["cues"], "yara", fact.key)  # cached again
    seen = listener.notifications
    _erase(world, "user:yara")
    wait_for(lambda: listener.notifications > seen, timeout=2, interval=0.01, what="the erasure notification")
    assert not _names(recall(world, query)["cues"], "yara", fact.key)


def test_a_load_in_flight_during_an_erasure_is_not_cached(world):
    """A reload that read the rows before the erasure committed must not put them back in the cache."""
    settings = world["settings"]
    key = (settings.pg_schema, TENANT)

    async def scenario() -> dict[str, bool]:
        pool = async_pool(settings)
        await pool.open()
        try:
            cache = VocabularyCache()
            task = cache._start(pool, key)  # reads the rows "before the erasure"
            cache.invalidate(*key)  # the notification arrives meanwhile
            vocab = await task
            seen = {"served": ("p1",) in vocab.entities.values(), "cached": key in cache._items}
            await cache.get(pool, *key)  # the next one loads (and caches) afresh
            return {**seen, "cached_after": key in cache._items}
        finally:
            await pool.close()

    assert run(scenario()) == {"served": True, "cached": False, "cached_after": True}


# --- the search a hostile query drives is bounded too (pure: no server) -----------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("shape", list(CUE_SHAPES))
def test_a_hostile_query_builds_a_bounded_search(shape):
    import orjson

    from projections.search.cues import extract
    from projections.search.recall.index import ElasticIndex
    from projections.search.recall.model import RecallQuery
    from projections.search.recall.stages import ExactStage, KeywordStage, RecallContext, SemanticStage
    from projections.search.recall.trace import Trace
    from tests.test_cues import BIG_VOCAB, NOW

    query = CUE_SHAPES[shape](2000)
    cues = extract(query, BIG_VOCAB, NOW)
    index = ElasticIndex(None, "facts")  # type: ignore[arg-type]  # builds bodies only, sends nothing
    q = RecallQuery(tenant=TENANT, query=query, mode="hybrid")
    ctx = RecallContext.of(q, NOW, cues, index, Trace(q.mode), embedder=None)  # type: ignore[arg-type]
    exact, keyword, semantic = ExactStage().ask(ctx), KeywordStage().ask(ctx), SemanticStage().ask(ctx)
    assert semantic is not None
    bodies = {  # the three searches of a hybrid recall, the kNN one without its (fixed-size) vector
        "exact": exact and index.exact_body(exact.scope, exact.keys, exact.event_types, 20),
        "keyword": keyword and index.keyword_body(keyword.scope, keyword.text, 10),
        "semantic": index.nearest_body(semantic.scope, [], 10),
    }
    # now <= 6 kB for all three; before: 2 clauses per distinct id token (34 kB at 2,000 for the filters alone)
    assert len(orjson.dumps(bodies)) < 8_000

"""The API's cue vocabulary follows the indexer (projections.search.vocab): no TTL decides it.

Against the real servers: a worker and the `ledger indexer` process, and two API apps (two processes' caches). A
new fact's entity and alias are cues of the first recall after its document is indexed, in both, answered by the
exact stage; the caches read only the delta; a watermark the log no longer reaches means a full reload. In one
process (the recorder and the indexer's drain in-process): every mode and shape of question right after a version
is logged has the cues of a fresh vocabulary, whether the exact stage's statement or a round trip of its own read
the log, and a sequence read before another recall caught up reloads nothing. A unit test checks
`Vocabulary.merged` against a build over both inputs, over many random inputs.
"""

from __future__ import annotations

import asyncio
import random
import threading
from datetime import UTC, datetime

import pytest
from elasticsearch import AsyncElasticsearch, Elasticsearch
from fastapi.testclient import TestClient

from api.main import create_app
from projections.search.cues import Vocabulary, extract
from projections.search.recall import RecallEngine
from projections.search.recall.model import RecallQuery
from projections.search.vocab import VocabularyCache, load_vocabulary, log_indexed
from tests.conftest import unique
from tests.support import RecorderWriter, asserted, async_pool, drain_all, pg, pipeline, private_store, wait_for

TENANT, KEY = "vocabco", "k-vocab"
H = {"X-API-Key": KEY}


def _recall(client: TestClient, query: str) -> dict:
    r = client.post("/v1/recall", json={"tenant": TENANT, "query": query, "mode": "auto"}, headers=H)
    assert r.status_code == 200, r.text
    return r.json()


def _searchable(settings, version_id: str) -> bool:
    es = Elasticsearch(settings.es_url, request_timeout=30)
    try:
        es.indices.refresh(index=settings.es_index)
        return bool(es.exists(index=settings.es_index, id=version_id))
    finally:
        es.close()


def test_a_new_entity_and_alias_are_exact_cues_of_the_first_recall_after_indexing(base_settings):
    settings = base_settings.private(unique("vocab"), api_keys={KEY: [TENANT]})
    seed = [
        asserted(
            "project:P1",
            "project.port",
            8080,
            0,
            tenant=TENANT,
            content="项目 P1 的后端服务端口是 8080",
            entities=["P1"],
            aliases=["端口"],
        )
    ]
    with (
        pipeline(settings, seed=seed) as pipe,
        TestClient(create_app(settings)) as a,
        TestClient(create_app(settings)) as b,
    ):
        caches = [client.app.state.resources.recall.vocab for client in (a, b)]
        for client, cache in zip((a, b), caches, strict=True):  # each cache holds the tenant's vocabulary, no Q7
            assert _recall(client, "P1 项目的端口是多少")["hits"][0]["match"]["stage"] == "exact"
            wait_for(lambda c=cache: c.listener.listening, 10, what="the erasure listener")  # (its connect drops all)
            assert "q7" not in _recall(client, "Q7 项目的端口是多少")["cues"]["known_entities"]
        loads = [(c.full_loads, c.delta_loads) for c in caches]
        new = asserted(
            "project:Q7",
            "project.listen_port",
            8081,
            1,
            tenant=TENANT,
            content="项目 Q7 的后端服务端口是 8081",
            entities=["Q7"],
            aliases=["监听端口", "listen port"],
        )
        pipe.publish([new])
        wait_for(lambda: _searchable(settings, new.version_id), 60, 0.05, "Q7's document")
        for client in (a, b):  # the first question after the document exists: exact, with the new cues
            res = _recall(client, "Q7 项目的监听端口是多少")
            top = res["hits"][0]
            assert (top["memory_id"], top["value"], top["match"]["stage"]) == (new.memory_id, 8081, "exact"), res
            assert "q7" in res["cues"]["known_entities"]
            assert "project.listen_port" in {k for al in res["cues"]["aliases"] for k in al["keys"]}, res["cues"]
        for cache, (full, delta) in zip(caches, loads, strict=True):  # what changed was read, not the tenant whole
            assert cache.full_loads == full and cache.delta_loads > delta, (loads, cache.full_loads, cache.delta_loads)


def test_a_watermark_the_log_no_longer_reaches_reloads_the_tenant_whole(base_settings):
    settings = base_settings.private(unique("vocab"), api_keys={KEY: [TENANT]})
    seed = [asserted("project:P1", "project.port", 8080, 0, tenant=TENANT, content="P1 port", entities=["P1"])]
    with pipeline(settings, seed=seed) as pipe:
        key = (settings.pg_schema, TENANT)

        async def scenario() -> tuple[int, int, int, bool]:
            pool = async_pool(settings)
            await pool.open()
            try:
                cache = VocabularyCache()
                await cache.get(pool, *key)
                first = cache.watermark(*key)
                pipe.publish(
                    [asserted("project:Z9", "project.port", 1, 1, tenant=TENANT, content="Z9", entities=["Z9"])]
                )
                pipe.settle()
                with pg(settings) as conn:  # the log is pruned past this cache's watermark
                    conn.execute("DELETE FROM vocab_log WHERE seq <= (SELECT max(seq) FROM vocab_log)")
                    conn.commit()
                pipe.publish(
                    [asserted("project:Y8", "project.port", 2, 2, tenant=TENANT, content="Y8", entities=["Y8"])]
                )
                pipe.settle()
                vocab = await cache.get(pool, *key)
                known = {("z9",), ("y8",)} <= set(vocab.entities.values())
                return first or 0, cache.full_loads, cache.delta_loads, known
            finally:
                await pool.close()

        first, full, delta, knows = asyncio.run(scenario())
        assert first > 0 and full == 2 and delta == 0 and knows, (first, full, delta, knows)


# new words, one per case: an alias of a new key that no cached vocabulary can know
WORDS = (
    "quokka wombat narwhal axolotl pangolin okapi tapir ibex dugong kinkajou marmot capybara lemur gecko bison heron"
)
SHAPES = (  # a new id alone; a new id and a new alias; a known id and a new alias; a new alias alone
    "QZ{i}",
    "QZ{i} {word} port",
    "P1 {word} port",
    "what is the {word} port",
)


def test_the_first_recall_after_a_version_is_logged_has_the_cues_of_a_fresh_vocabulary(base_settings):
    """Whichever way a recall checks its cached vocabulary (the tenant's newest vocab_log sequence read by the exact
    stage's own statement, or the log's marks by a round trip before any stage runs), every mode and shape of
    question extracts its cues, right after a new version is logged, as a vocabulary loaded afresh does; and a warm
    exact recall reads the log only within its statement."""
    settings = base_settings.private(unique("vocab"))
    words = WORDS.split()
    with private_store(settings) as (conn, es), RecorderWriter(settings) as w:
        w.assert_fact(TENANT, "project:P1", "project.port", "P1 port 8080", 8080, entities=["P1"], aliases=["端口"])
        drain_all(settings, conn, es, None)

        async def scenario() -> tuple[list, list, dict[str, int]]:
            pool = async_pool(settings)
            await pool.open()
            engine = RecallEngine(settings, AsyncElasticsearch(settings.es_url), pool)
            cache, counts = engine.vocab, {"standalone": 0}
            own_marks = cache._marks

            async def counted(*args):  # the marks read by a round trip of their own
                counts["standalone"] += 1
                return await own_marks(*args)

            cache._marks = counted
            stale, missed = [], []
            try:
                cases = [(m, sh) for m in ("auto", "exact", "hybrid", "keyword") for sh in SHAPES]
                for i, (mode, shape) in enumerate(cases):
                    query = shape.format(i=i, word=words[i])
                    ask = RecallQuery(tenant=TENANT, query=query, mode=mode, rerank=False)
                    await engine.recall(ask)  # cached now, without what comes next
                    new = w.assert_fact(
                        TENANT,
                        f"project:QZ{i}",
                        f"project.port_{i}",
                        f"QZ{i} serves {words[i]} port {9000 + i}",
                        9000 + i,
                        entities=["P1", f"QZ{i}"],
                        aliases=[f"{words[i]} port"],
                    )
                    await asyncio.to_thread(drain_all, settings, conn, es, None)  # indexed and logged
                    res = await engine.recall(ask)
                    async with pool.connection() as c:
                        fresh = extract(query, await load_vocabulary(c, TENANT), datetime.now(UTC)).as_dict()
                    if res["cues"] != fresh:
                        stale.append((mode, query, res["cues"], fresh))
                    if mode != "keyword" and "QZ" in shape:  # the exact tier answers with the new fact
                        top = res["hits"][0] if res["hits"] else {}
                        if (top.get("memory_id"), top.get("match", {}).get("stage")) != (new.memory_id, "exact"):
                            missed.append((mode, query, res["hits"][:2]))
                before = counts["standalone"], cache.full_loads, cache.delta_loads
                for _ in range(3):  # warm, nothing logged meanwhile: no round trip of its own, nothing loaded
                    await engine.recall(RecallQuery(tenant=TENANT, query="QZ1", mode="exact"))
                counts["warm"] = counts["standalone"] - before[0]
                counts["loads"] = cache.full_loads + cache.delta_loads - before[1] - before[2]
            finally:
                await engine.aclose()
                await engine.es.close()
                await pool.close()
            return stale, missed, counts

        stale, missed, counts = asyncio.run(scenario())
    assert not stale, stale
    assert not missed, missed
    assert counts["warm"] == 0 and counts["loads"] == 0, counts


def test_a_sequence_read_before_another_recall_caught_up_reloads_nothing(base_settings):
    """The newest sequence a recall read in its own statement may be older than the entry by the time it hands it
    over (another recall caught up meanwhile): that is not a reason to read the tenant whole; a sequence past the
    entry is a delta; an entry past the log's newest sequence read now (a rebuilt schema) is a full reload."""
    settings = base_settings.private(unique("vocab"))
    with private_store(settings) as (conn, _es):
        key = (settings.pg_schema, TENANT)

        def newest() -> int:
            return conn.execute("SELECT max(seq) FROM vocab_log WHERE tenant = %s", (TENANT,)).fetchone()[0]

        async def scenario() -> list[tuple[int, int, bool]]:
            pool = async_pool(settings)
            await pool.open()
            try:
                cache, out = VocabularyCache(), []
                log_indexed(conn, [(TENANT, "v-1")])
                first = await cache.get(pool, *key)
                assert cache.cached(*key) is first and await cache.current(pool, *key, newest()) is first
                log_indexed(conn, [(TENANT, "v-2")])
                older = newest()  # read by a recall, handed over after another one caught up
                log_indexed(conn, [(TENANT, "v-3")])
                caught_up = await cache.current(pool, *key, newest())
                out.append((cache.full_loads, cache.delta_loads, cache.watermark(*key) == newest()))
                out.append((cache.full_loads, cache.delta_loads, await cache.current(pool, *key, older) is caught_up))
                cache._items[key] = (10**9, caught_up)  # the entry of a schema whose sequence has since restarted
                await cache.current(pool, *key, newest())
                out.append((cache.full_loads, cache.delta_loads, cache.watermark(*key) == newest()))
                return out
            finally:
                await pool.close()

        assert asyncio.run(scenario()) == [(1, 1, True), (1, 1, True), (2, 1, True)]


def test_a_load_that_finished_in_the_same_turn_is_not_waited_on_again(base_settings):
    """A recall that reads a newer sequence in the turn of the loop in which an older load finished (its
    done-callback not run yet) starts a load of its own: it used to take the finished one for the load in flight and
    loop on it without yielding, so that callback never ran and the API's event loop spun for good."""
    settings = base_settings.private(unique("vocab"))
    with private_store(settings) as (conn, _es):
        key = (settings.pg_schema, TENANT)

        async def scenario() -> bool:
            pool = async_pool(settings)
            await pool.open()
            try:
                cache = VocabularyCache()
                log_indexed(conn, [(TENANT, "v-1")])
                first = await cache.get(pool, *key)
                log_indexed(conn, [(TENANT, "v-2")])

                async def finished() -> Vocabulary:
                    return first

                stale = asyncio.get_running_loop().create_task(finished())
                await stale
                cache._loading[key] = stale  # finished, still listed: its done-callback is not attached here
                await cache.get(pool, *key)
                newest = conn.execute("SELECT max(seq) FROM vocab_log WHERE tenant = %s", (TENANT,)).fetchone()[0]
                return cache.watermark(*key) == newest
            finally:
                await pool.close()

        answers: list[bool] = []
        thread = threading.Thread(target=lambda: answers.append(asyncio.run(scenario())), daemon=True)
        thread.start()
        thread.join(60)  # a spinning loop never returns (nor lets a timeout inside it fire)
        assert not thread.is_alive(), "VocabularyCache.get spins on a finished load"
        assert answers == [True]


@pytest.mark.unit
def test_merging_two_vocabularies_equals_building_over_both_inputs():
    rng = random.Random(14)
    words = ["P1", "Q7", "OD5001", "端口", "backend port", "listen port", "window seat", "用户", "ZQ4242", "alpha"]
    for _ in range(300):

        def inputs():
            return (
                rng.sample(words, rng.randint(0, 4)),
                [f"{rng.choice(['user', 'project', 'team'])}:{rng.choice(words)}" for _ in range(rng.randint(0, 3))],
                [(f"k.{rng.randint(0, 3)}", rng.sample(words, rng.randint(0, 3))) for _ in range(rng.randint(0, 3))],
            )

        (e1, s1, k1), (e2, s2, k2) = inputs(), inputs()
        merged = Vocabulary.build(entities=e1, subjects=s1, key_aliases=k1).merged(
            Vocabulary.build(entities=e2, subjects=s2, key_aliases=k2)
        )
        full = Vocabulary.build(entities=e1 + e2, subjects=s1 + s2, key_aliases=k1 + k2)
        for name in ("entities", "aliases", "namespaces", "word_sets", "entity_heads", "alias_heads"):
            assert getattr(merged, name) == getattr(full, name), (name, e1, s1, k1, e2, s2, k2)


def test_no_vocab_log_is_kept_beyond_its_bound(base_settings):
    """The indexer prunes the log to its newest VOCAB_LOG_KEEP rows (checked with a small bound)."""
    from projections.search import vocab

    settings = base_settings.private(unique("vocab"))
    with private_store(settings) as (conn, _es):
        keep, vocab.VOCAB_LOG_KEEP = vocab.VOCAB_LOG_KEEP, 5
        try:
            for i in range(4):
                vocab.log_indexed(conn, [(TENANT, f"v{i}-{j}") for j in range(3)])
        finally:
            vocab.VOCAB_LOG_KEEP = keep
        n, low, high = conn.execute("SELECT count(*), min(seq), max(seq) FROM vocab_log").fetchone()
    assert n == 5 and high - low == 4, (n, low, high)

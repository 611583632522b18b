"""The rerank stage against the real servers: the cross-encoder reorders fuzzy hits only.

One private schema + index for the module, written through the PostgreSQL projection's recorder and drained into
Elasticsearch; the app (create_app, real pools, the cross-encoder loaded in the background as in production)
answers over HTTP. The settings-dependent cases swap the engine's `Reranker` for one built from changed settings.
The pure pieces (the ordering, the budgeted scoring loop) have unit tests at the end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from itertools import count

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from projections.embedding import load_embedder
from projections.reranker import CrossEncoder, load_cross_encoder
from projections.search.recall.rerank import Batches, Reranker, head_scored, reorder, rerank_key, score_within
from tests.conftest import unique
from tests.support import RecorderWriter as Ledger
from tests.support import drain_all, private_store
from tests.support.waiting import wait_for

TENANT = "rrco"
KEYS = {"k-rr": [TENANT]}
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
EXACT_QUERY = "what is the backend port of P1"
# episodic turns: one answers the question, the others share its words without answering it
TURNS = [
    ("person:caroline", "Caroline: I went to the LGBTQ support group yesterday and it was so powerful."),
    ("person:melanie", "Melanie: I took the kids to the museum yesterday, they loved the dinosaur bones."),
    ("person:caroline", "Caroline: The support group meets on Tuesdays, I want to go more often."),
    ("person:melanie", "Melanie: Painting is my way to relax after a long week with the kids."),
    ("person:caroline", "Caroline: I am researching adoption agencies, I want to give a kid a loving home."),
    ("person:melanie", "Melanie: We went camping at the beach last summer and roasted marshmallows."),
    ("person:caroline", "Caroline: Counseling for transgender people is the career I want to pursue."),
    ("person:melanie", "Melanie: Yesterday was busy, I went to the group pottery class with my friends."),
    ("person:lihua", "李华：我昨天去了支持小组，大家都很友好。"),
    ("person:lihua", "李华：支持小组每周二活动，我想多去几次。"),
]
# more turns on one topic than a list cut to top_k holds: the pool must hold them all (recall_pool)
HIKES = [f"Melanie: We went hiking on trail {i} with the kids and saw {i} deer." for i in range(1, 26)]
HIKE_QUERY = "hiking trail deer"
CHINESE_QUERY = "李华什么时候去的支持小组"
FUZZY_QUERY = "When did Caroline go to the support group?"


@pytest.fixture(scope="module")
def world(base_settings) -> Iterator[dict]:
    name = unique("rr")
    settings = base_settings.model_copy(
        update={
            "pg_schema": name,
            "es_index": f"{name}-facts",
            "topic": f"{name}.events",
            "access_topic": f"{name}.access",  # never created: the app's accesses are dropped
            "api_keys": KEYS,
            "rerank_enabled": True,
            "rerank_candidates": 20,
            "rerank_budget_ms": 10_000.0,  # the cases below are about order; the budget has its own case
        }
    )
    embedder = load_embedder(settings)
    with private_store(settings) as (conn, es):
        ledger = Ledger(settings, conn)
        clock = count()
        exact = ledger.assert_fact(
            TENANT,
            "project:P1",
            "project.backend_port",
            "P1: 8080",  # a terse fact: the cross-encoder prefers the chatty turns below
            8080,
            aliases=["backend port"],
            entities=["P1"],
            valid_from=T0,
        )
        for text in (
            "The backend port of project P1 is something we discussed: what is the backend port of P1 again?",
            "For P1 the question of which backend port to use came up; the backend port of P1 is configurable.",
        ):
            ledger.assert_fact(
                TENANT, "project:P1", None, text, kind="episodic", entities=["P1"], valid_from=T0 + timedelta(1)
            )
        for subject, text in [*TURNS, *(("person:melanie", h) for h in HIKES)]:
            ledger.assert_fact(
                TENANT, subject, None, text, kind="episodic", valid_from=T0 + timedelta(minutes=next(clock))
            )
        drain_all(settings, conn, es, embedder)
        with TestClient(create_app(settings)) as client:
            engine = client.app.state.recall_engine
            # the API loads the cross-encoder in the background: wait until a fuzzy query is reranked
            wait_for(lambda: post(client, FUZZY_QUERY)["trace"]["rerank"]["computed"], 120, 0.5, "the cross-encoder")
            yield {"settings": settings, "client": client, "engine": engine, "exact": exact.memory_id}
        ledger.close()


def post(client: TestClient, query: str, **body) -> dict:
    r = client.post(
        "/v1/recall", json={"tenant": TENANT, "query": query, "top_k": 10, **body}, headers={"X-API-Key": "k-rr"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def recall(world, query: str, **body) -> dict:
    return post(world["client"], query, **body)


@pytest.fixture
def swap(world) -> Iterator:
    """Replace the engine's rerank stage with one built from changed settings; the original is put back."""
    engine = world["engine"]
    original = engine.reranker

    def use(**update) -> None:
        engine.reranker = Reranker(
            world["settings"].model_copy(update=update), model=load_cross_encoder(world["settings"])
        )

    yield use
    engine.reranker = original


def fuzzy(hits: list[dict]) -> list[dict]:
    return [h for h in hits if h["match"]["stage"] != "exact"]


def test_rerank_never_lifts_a_fuzzy_hit_above_an_exact_one(world):
    res = recall(world, EXACT_QUERY, mode="hybrid")
    hits = res["hits"]
    assert hits[0]["memory_id"] == world["exact"] and hits[0]["match"]["stage"] == "exact", hits
    stages = [h["match"]["stage"] for h in hits]
    first_fuzzy = next(i for i, s in enumerate(stages) if s != "exact")
    assert all(s != "exact" for s in stages[first_fuzzy:])
    assert all(h["score"] >= 1 for h in hits[:first_fuzzy]) and all(h["score"] < 1 for h in hits[first_fuzzy:])
    assert res["trace"]["rerank"]["computed"] is True  # the fuzzy hits were reranked ...
    assert all("rerank" not in h["match"]["scores"] for h in hits[:first_fuzzy])  # ... the exact ones never scored
    # the test means something: the cross-encoder itself prefers the best fuzzy hit to the exact one
    ce = load_cross_encoder(world["settings"])
    best = max(h["match"]["scores"]["rerank"] for h in fuzzy(hits))
    assert best > ce.score(EXACT_QUERY, [hits[0]["content"]])[0]


def test_a_question_the_exact_stage_answers_computes_no_cross_encoder_score(world):
    for mode in ("auto", "exact"):
        res = recall(world, EXACT_QUERY, mode=mode)
        assert res["hits"] and all(h["match"]["stage"] == "exact" for h in res["hits"]), (mode, res["hits"])
        assert "cross_encoder" not in res["trace"]["stages_ms"], mode
        assert res["trace"].get("rerank", {}).get("computed", False) is False, mode
        assert all("rerank" not in h["match"]["scores"] for h in res["hits"])


def test_a_question_that_is_not_english_is_not_reranked(world):
    res = recall(world, CHINESE_QUERY)
    assert fuzzy(res["hits"]), res  # there was something to rerank ...
    assert res["trace"]["rerank"]["stopped"] == "language" and res["trace"]["rerank"]["computed"] is False
    assert "cross_encoder" not in res["trace"]["stages_ms"]  # ... and the English model was not asked
    off = recall(world, CHINESE_QUERY, rerank=False)
    assert [(h["memory_id"], h["score"]) for h in res["hits"]] == [(h["memory_id"], h["score"]) for h in off["hits"]]


def test_the_explanation_carries_the_cross_encoder_score_and_the_rank_before(world):
    on, off = recall(world, FUZZY_QUERY), recall(world, FUZZY_QUERY, rerank=False)
    trace = on["trace"]
    assert trace["rerank"]["computed"] is True and trace["rerank"]["stopped"] is None
    assert "cross_encoder" in trace["stages_ms"] and trace["rerank"]["scored"] == trace["rerank"]["candidates"]
    scored = [h for h in on["hits"] if "rerank" in h["match"]["scores"]]
    assert len(scored) == min(10, trace["rerank"]["scored"]) and scored == on["hits"][: len(scored)]
    ce = [h["match"]["scores"]["rerank"] for h in scored]
    assert ce == sorted(ce, reverse=True)  # weight 1: by the cross-encoder alone
    assert [h["score"] for h in on["hits"]] == sorted((h["score"] for h in on["hits"]), reverse=True)
    # rank_before_rerank is the position the hit had without the stage
    before = [h["memory_id"] for h in off["hits"]]
    for h in scored:
        rank = h["match"]["scores"]["rank_before_rerank"]
        assert rank > len(before) or before[rank - 1] == h["memory_id"], (rank, h["content"])
    assert "support group yesterday" in on["hits"][0]["content"], [h["content"] for h in on["hits"]]


def test_rerank_false_and_the_setting_off_give_the_order_before_rerank(world, swap):
    off = recall(world, FUZZY_QUERY, rerank=False)
    assert "rerank" not in off["trace"] and "cross_encoder" not in off["trace"]["stages_ms"]
    assert all("rerank" not in h["match"]["scores"] for h in off["hits"])
    swap(rerank_enabled=False)
    setting_off = recall(world, FUZZY_QUERY)
    forced_on = recall(world, FUZZY_QUERY, rerank=True)  # the request's flag wins over the setting
    key = [(h["memory_id"], h["score"]) for h in off["hits"]]
    assert [(h["memory_id"], h["score"]) for h in setting_off["hits"]] == key
    assert forced_on["trace"]["rerank"]["computed"] is True
    # the same hits and scores, in another order: the stage permutes positions, it adds or drops nothing
    assert sorted(h["memory_id"] for h in forced_on["hits"]) == sorted(h["memory_id"] for h in off["hits"])
    assert [h["score"] for h in forced_on["hits"]] == [s for _, s in key]


def test_a_tiny_budget_stops_the_stage_early_and_keeps_the_fused_order(world, swap):
    off = recall(world, FUZZY_QUERY, rerank=False)
    assert len(fuzzy(off["hits"])) >= 3, off["hits"]
    swap(rerank_budget_ms=0.001, rerank_batch_size=1, rerank_candidates=3)
    res = recall(world, FUZZY_QUERY)
    info = res["trace"]["rerank"]
    assert info["candidates"] == 3 and info["stopped"] == "budget" and info["reranked"] is False, info
    assert info["scored"] <= 1 and info["budget_ms"] == 0.001
    assert [(h["memory_id"], h["score"]) for h in res["hits"]] == [(h["memory_id"], h["score"]) for h in off["hits"]]
    assert all("rerank" not in h["match"]["scores"] for h in res["hits"])


class SlowModel:
    """The real cross-encoder behind a fixed delay a call: a model slower than the budget, on any host."""

    def __init__(self, model: CrossEncoder, delay_s: float) -> None:
        self.name, self.model, self.delay_s = model.name, model, delay_s

    def score(self, query: str, texts: list[str]) -> list[float]:
        time.sleep(self.delay_s)
        return self.model.score(query, texts)


@pytest.mark.parametrize(
    ("delay_s", "budget_ms"),
    [(0.4, 50.0), (0.03, 100.0)],  # the first batch alone is late; some batches finish in time, not all
    ids=["first-batch-late", "part-in-time"],
)
def test_over_budget_the_answer_is_not_late_and_only_what_was_scored_moves(world, delay_s, budget_ms):
    off = recall(world, HIKE_QUERY, rerank=False)
    engine, original = world["engine"], world["engine"].reranker
    settings = world["settings"].model_copy(
        update={"rerank_budget_ms": budget_ms, "rerank_batch_size": 1, "rerank_candidates": 8}
    )
    engine.reranker = Reranker(settings, model=SlowModel(load_cross_encoder(world["settings"]), delay_s))  # type: ignore[arg-type]
    try:
        res = recall(world, HIKE_QUERY)
    finally:
        engine.reranker = original
        time.sleep(delay_s + 0.05)  # the stage's thread ends its batch before the next case uses it
    # never late: the stage waits no longer than its budget (plus the event loop's hand-back)
    assert res["trace"]["stages_ms"]["cross_encoder"] < budget_ms + 100, res["trace"]["stages_ms"]
    info = res["trace"]["rerank"]  # the trace says what happened
    assert info["candidates"] == 8 and info["stopped"] == "budget" and info["scored"] < 8, info
    before = [(h["memory_id"], h["score"]) for h in off["hits"]]
    after = [(h["memory_id"], h["score"]) for h in res["hits"]]
    k = info["scored"]
    if k < 2:  # nothing could trade places: the fused order and scores, no cross-encoder score shown
        assert info["reranked"] is False, info
        assert after == before and all("rerank" not in h["match"]["scores"] for h in res["hits"])
        return
    # the head that was scored trades places among itself; everything after it keeps its fused place and score
    assert info["reranked"] == "partial", info
    head = fuzzy(off["hits"])[:k]
    first = next(i for i, h in enumerate(off["hits"]) if h["memory_id"] == head[0]["memory_id"])
    assert sorted(m for m, _ in after[first : first + k]) == sorted(h["memory_id"] for h in head)
    assert after[first + k :] == before[first + k :] and after[:first] == before[:first]
    assert [s for _, s in after] == [s for _, s in before]
    assert sum("rerank" in h["match"]["scores"] for h in res["hits"]) == k


def test_the_pool_holds_every_turn_the_stages_find_whatever_top_k(world):
    for top_k in (1, 10):
        res = recall(world, HIKE_QUERY, top_k=top_k, explain=True)
        trace = res["trace"]
        # BM25 finds all 25 turns on the topic, and every one of them is in the fused pool before the cut
        assert trace["fuzzy_candidates"] >= len(HIKES), (top_k, trace)
        assert trace["rerank"]["candidates"] == 20 and trace["rerank"]["reranked"] is True, trace["rerank"]
        assert len(res["hits"]) == top_k


@pytest.mark.parametrize("query", [HIKE_QUERY, FUZZY_QUERY])
def test_the_pool_holds_what_bm25_and_the_vector_search_find(world, query):
    # each stage alone (its own mode), then both fused: nothing either found is lost before the rerank (a hit may
    # stand for its near-duplicates, recall.groups: which copy leads its group depends on the order)
    hits = {
        mode: recall(world, query, mode=mode, top_k=100, rerank=False, explain=True)["hits"]
        for mode in ("keyword", "semantic", "auto")
    }
    found = {mode: {h["version_id"] for h in hs} for mode, hs in hits.items()}
    pool = found["auto"] | {d for h in hits["auto"] for d in h["match"].get("duplicates") or ()}
    assert found["keyword"] and found["semantic"], found
    assert found["keyword"] | found["semantic"] <= pool, {
        "keyword only": found["keyword"] - pool,
        "semantic only": found["semantic"] - pool,
    }
    if query == HIKE_QUERY:  # more turns on one topic than a top_k of 10: the pool is not cut to it first
        assert len(found["keyword"]) > 20 and len(found["auto"]) > 20, found


def test_equal_questions_get_equal_rankings(world):
    first, again = recall(world, HIKE_QUERY), recall(world, HIKE_QUERY)
    assert first["trace"]["rerank"]["reranked"] is True
    key = [(h["memory_id"], h["score"], h["match"]["scores"].get("rerank")) for h in first["hits"]]
    assert [(h["memory_id"], h["score"], h["match"]["scores"].get("rerank")) for h in again["hits"]] == key


def test_a_pairs_score_does_not_depend_on_the_other_candidates(world, swap):
    # the int8 model quantizes a batch's activations together: a pair scored beside others got another logit (by
    # up to 0.4 on the dev set's turns), so a deeper pool or another deadline changed the order of the same hits
    scores = {}
    for n in (1, 3, 7, 20):
        swap(rerank_candidates=n, rerank_batch_size=world["settings"].rerank_batch_size)
        res = recall(world, HIKE_QUERY, top_k=20)
        assert res["trace"]["rerank"]["scored"] == n, res["trace"]["rerank"]
        for h in res["hits"]:
            if "rerank" in h["match"]["scores"]:
                scores.setdefault(h["memory_id"], set()).add(h["match"]["scores"]["rerank"])
    assert len(scores) > 10 and all(len(v) == 1 for v in scores.values()), scores


def test_threads_scoring_at_once_rank_as_one_thread_does(world, swap):
    # each thread takes the next pair and scores it alone: how many threads score must not change a score or a place
    got = {}
    for threads in (1, 2, 5):
        swap(rerank_threads=threads, rerank_batch_size=1)
        res = recall(world, HIKE_QUERY, top_k=20)
        assert res["trace"]["rerank"]["reranked"] is True and res["trace"]["rerank"]["scored"] == 20, res["trace"]
        got[threads] = [(h["memory_id"], h["score"], h["match"]["scores"].get("rerank")) for h in res["hits"]]
    assert got[1] == got[2] == got[5]


def test_the_candidate_count_bounds_what_is_scored(world, swap):
    off = recall(world, FUZZY_QUERY, rerank=False)
    assert len(fuzzy(off["hits"])) >= 3, off["hits"]
    swap(rerank_candidates=2)
    res = recall(world, FUZZY_QUERY)
    assert res["trace"]["rerank"]["candidates"] == 2 and res["trace"]["rerank"]["scored"] == 2
    assert sum("rerank" in h["match"]["scores"] for h in res["hits"]) == 2
    assert [h["memory_id"] for h in res["hits"][2:]] == [h["memory_id"] for h in off["hits"][2:]]


# --- the pure pieces -------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_reorder_sorts_by_the_blend_and_keeps_ties_in_their_order():
    strengths = [0.9, 0.8, 0.7, 0.6]
    assert reorder(strengths, [-5.0, 3.0, 3.0, 0.0], 1.0) == [1, 2, 3, 0]  # ties (1, 2) keep the order before
    assert reorder(strengths, [-5.0, 3.0, 3.0, 0.0], 0.0) == [0, 1, 2, 3]  # weight 0: the order before
    assert reorder(strengths, [9.0, -9.0], 1.0) == [0, 1]  # only the scored prefix is reordered
    assert reorder(strengths, [], 1.0) == []
    assert 0.0 < rerank_key(-50.0, 0.0, 1.0) < rerank_key(0.0, 0.0, 1.0) == 0.5 < rerank_key(50.0, 0.0, 1.0) <= 1.0
    assert rerank_key(2.0, 0.4, 0.5) == pytest.approx(0.5 * (1 / (1 + 2.718281828459045**-2)) + 0.2)


@pytest.mark.unit
def test_score_within_stops_before_a_batch_that_would_exceed_the_budget():
    now = [0.0]

    def clock() -> float:
        return now[0]

    def score(part: list[str]) -> list[float]:
        now[0] += 0.010 * len(part)  # 10 ms a text
        return [float(len(t)) for t in part]

    texts = ["a", "bb", "ccc", "dddd", "eeeee"]
    full = score_within(score, texts, 2, 1000.0, clock)
    assert full.scores == [1.0, 2.0, 3.0, 4.0, 5.0] and full.stopped is None
    short = score_within(score, texts, 2, 45.0, clock)  # 20 ms, then 40 ms: a third batch would end at 50+ ms
    assert short.scores == [1.0, 2.0, 3.0, 4.0] and short.stopped == "budget"
    first = score_within(score, texts, 2, 0.001, clock)  # the first batch always runs
    assert first.scores == [1.0, 2.0] and first.stopped == "budget"
    queued = score_within(score, texts, 2, 30.0, clock, start=now[0] - 0.030)  # 30 ms waiting for the thread
    assert queued.scores == [] and queued.stopped == "budget"
    late = score_within(score, texts, 2, 45.0, clock, start=now[0] - 0.010)  # 10 ms waited, then 20 ms a batch
    assert late.scores == [1.0, 2.0] and late.stopped == "budget"  # 30 ms spent + 20 ms projected > 45


@pytest.mark.unit
def test_threads_sharing_the_batches_score_each_text_once_head_first():
    texts = [f"t{i}" for i in range(23)]
    calls: list[list[str]] = []
    lock = threading.Lock()

    def score(part: list[str]) -> list[float]:
        time.sleep(0.001)  # long enough for the other threads to take batches meanwhile
        with lock:
            calls.append(part)
        return [float(t[1:]) for t in part]

    out: dict[int, float] = {}
    batches = Batches(len(texts), 2)
    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda _: score_within(score, texts, 2, 10_000.0, out=out, batches=batches), range(3)))
    assert sorted(t for part in calls for t in part) == sorted(texts)  # every text once, none twice
    assert sorted(len(part) for part in calls) == [1] + [2] * 11  # batches of 2, the last one short
    assert all(d.stopped is None for d in done)  # each returned its head when no batch was left: read `out` after all
    assert head_scored(out) == [float(i) for i in range(23)]


@pytest.mark.unit
def test_only_the_unbroken_head_counts_as_scored():
    assert head_scored({}) == [] and head_scored({1: 1.0, 2: 2.0}) == []
    assert head_scored({0: 0.5, 1: 1.5, 3: 3.5}) == [0.5, 1.5]  # a later batch finished first: it waits for 2
    assert head_scored({2: 2.0, 0: 0.0, 1: 1.0}) == [0.0, 1.0, 2.0]


@pytest.mark.unit
def test_score_within_starts_no_batch_once_the_caller_stopped_waiting():
    calls: list[list[str]] = []
    stop = threading.Event()

    def score(part: list[str]) -> list[float]:
        calls.append(part)
        stop.set()  # the deadline passes while the first batch runs
        return [0.0] * len(part)

    done = score_within(score, ["a", "b", "c", "d"], 2, 10_000.0, cancelled=stop)
    assert calls == [["a", "b"]] and done.scores == [0.0, 0.0] and done.stopped == "budget"

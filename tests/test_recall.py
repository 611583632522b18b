"""POST /v1/recall against the real servers: exact first, semantic fallback, empty when unrelated,
paraphrase stability, verification against a lagging index, tenancy, determinism.

One private schema + index for the module: facts go through the PostgreSQL projection's recorder,
the outbox is drained by the indexer, and the API (create_app, real pools) answers over HTTP.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from projections.embedding import load_embedder
from projections.search.reindex import orphans, reindex
from tests.conftest import unique
from tests.support import RecorderWriter as Ledger
from tests.support import drain_all, private_store

ACME, GLOBEX, LAG, TIMED, FRESH = "acme", "globex", "lagco", "timeco", "freshco"
KEYS = {"k-acme": [ACME], "k-globex": [GLOBEX], "k-all": [ACME, GLOBEX, LAG, TIMED, FRESH]}
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

# (subject, key, content, value, aliases, entities, kind)
ACME_FACTS = [
    (
        "project:P1",
        "project.backend_port",
        "P1 的后端服务端口是 8080",
        8080,
        ["端口", "后端服务地址", "backend port", "port"],
        ["P1"],
        "state",
    ),
    (
        "project:P1",
        "project.frontend_port",
        "P1 的前端端口是 3000",
        3000,
        ["前端端口", "frontend port"],
        ["P1"],
        "state",
    ),
    (
        "project:P1",
        "project.deploy_host",
        "P1 部署在 10.0.0.5 这台机器上",
        "10.0.0.5",
        ["部署机器", "deploy host"],
        ["P1"],
        "state",
    ),
    (
        "project:P2",
        "project.backend_port",
        "P2 的后端服务端口是 7000",
        7000,
        ["端口", "backend port", "port"],
        ["P2"],
        "state",
    ),
    (
        "user:42",
        "preference.seat",
        "用户 42 喜欢靠窗的座位",
        "window",
        ["座位偏好", "seat preference"],
        [],
        "preference",
    ),
    ("user:42", "preference.answer_style", "用户 42 希望回答简洁，不要太长", "concise", ["回答风格"], [], "preference"),
    (
        "user:alice",
        "preference.drink",
        "Alice prefers green tea in the morning",
        "green tea",
        ["饮料", "drink"],
        ["Alice"],
        "preference",
    ),
    (
        "order:OD20241102",
        "order.status",
        "订单 OD20241102 已退款",
        "refunded",
        ["订单状态", "order status"],
        ["OD20241102"],
        "state",
    ),
    ("company:acme", "company.annual_party", "公司年会在 12 月 20 日举行", "12-20", ["年会"], [], "state"),
    ("company:acme", "policy.expense_deadline", "报销需要在 30 天内提交", 30, ["报销期限"], [], "state"),
    ("company:acme", "it.vpn_address", "公司 VPN 地址是 vpn.acme.example", "vpn.acme.example", ["VPN"], [], "state"),
    (
        "project:P1",
        "project.staging_db",
        "The staging database of P1 is PostgreSQL on db-staging:5432",
        "db-staging:5432",
        ["staging database"],
        ["P1"],
        "state",
    ),
    ("user:bob", "profile.team", "Bob works on the payments team", "payments", ["team"], ["Bob"], "state"),
]
GLOBEX_FACTS = [
    (
        "project:P1",
        "project.backend_port",
        "P1 backend port is 9090",
        9090,
        ["port", "backend port", "端口"],
        ["P1"],
        "state",
    ),
    ("company:globex", "secret.recipe", "黄金配方锁在总部的保险柜里", "vault", ["配方"], [], "state"),
]
UNRELATED = [
    "今天天气怎么样",
    "what is the capital of France",
    "如何做红烧肉",
    "股票明天会涨吗",
    "quantum chromodynamics lecture notes",
    "my cat is sleeping on the sofa",
    "推荐一部科幻电影",
    "how do I bake sourdough bread",
]


@pytest.fixture(scope="module")
def world(base_settings):
    name = unique("rc")
    settings = base_settings.model_copy(
        update={
            "pg_schema": name,
            "es_index": f"{name}-facts",
            "topic": f"{name}.events",
            "access_topic": f"{name}.access",  # never created: the app's accesses are dropped, not sent elsewhere
            "api_keys": KEYS,
        }
    )
    embedder = load_embedder(settings)
    with private_store(settings) as (conn, es):
        ledger = Ledger(settings, conn)
        mids: dict[tuple[str, str, str], str] = {}
        for tenant, facts in ((ACME, ACME_FACTS), (GLOBEX, GLOBEX_FACTS)):
            for i, (subject, key, content, value, aliases, entities, kind) in enumerate(facts):
                e = ledger.assert_fact(
                    tenant,
                    subject,
                    key,
                    content,
                    value,
                    aliases=aliases,
                    entities=entities,
                    kind=kind,
                    valid_from=T0 + timedelta(hours=i),
                )
                mids[(tenant, subject, key)] = e.memory_id
        drain_all(settings, conn, es, embedder)
        with TestClient(create_app(settings)) as client:
            yield {"settings": settings, "conn": conn, "es": es, "ledger": ledger, "client": client, "mids": mids}
        ledger.close()


def recall(world, query: str, tenant: str = ACME, key: str = "k-all", **body) -> dict:
    r = world["client"].post("/v1/recall", json={"tenant": tenant, "query": query, **body}, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    return r.json()


def test_entity_id_query_hits_exactly_without_computing_an_embedding(world):
    for query, fact in [
        ("OD20241102 退款了吗", ("order:OD20241102", "order.status")),
        ("P1 部署在哪台机器", ("project:P1", "project.deploy_host")),
        ("order status of OD20241102", ("order:OD20241102", "order.status")),
    ]:
        res = recall(world, query)
        top = res["hits"][0]
        assert top["memory_id"] == world["mids"][(ACME, *fact)], (query, res["hits"])
        assert top["match"]["stage"] == "exact" and top["score"] >= 1
        assert res["trace"]["embedding_computed"] is False and "embed" not in res["trace"]["stages_ms"]
        assert all(h["match"]["stage"] == "exact" for h in res["hits"])


def test_phrasings_in_chinese_and_english_return_the_same_memory(world):
    expected = world["mids"][(ACME, "project:P1", "project.backend_port")]
    for query in [
        "P1 的后端服务端口是多少",
        "P1 后端端口",
        "what port does the P1 backend use",
        "backend port of project P1",
        "P1 的后端服务地址",
    ]:
        res = recall(world, query)
        top = res["hits"][0]
        assert (top["memory_id"], top["value"], top["match"]["stage"]) == (expected, 8080, "exact"), (query, res)
        assert "p1" in res["cues"]["known_entities"] or "project:p1" in res["cues"]["known_entities"]
        assert top["match"]["cues"]["keys"] == ["project.backend_port"]


def test_a_vague_query_falls_back_to_semantic(world):
    for query, fact in [
        ("那个订单退款了吗", ("order:OD20241102", "order.status")),
        ("用户喜欢坐在哪里", ("user:42", "preference.seat")),
        ("Alice 早上喜欢喝什么", ("user:alice", "preference.drink")),
    ]:
        res = recall(world, query)
        assert res["hits"], (query, res)
        top = res["hits"][0]
        assert top["memory_id"] == world["mids"][(ACME, *fact)], (query, res["hits"])
        assert top["match"]["stage"] in ("semantic", "hybrid"), top["match"]
        assert res["trace"]["embedding_computed"] is True and top["score"] < 1


@pytest.mark.parametrize("mode", ["auto", "semantic", "keyword", "hybrid"])
def test_an_unrelated_query_returns_nothing(world, mode):
    for query in UNRELATED:
        res = recall(world, query, mode=mode)
        assert res["hits"] == [], (query, mode, res["hits"])


def test_an_unknown_id_never_borrows_another_entitys_answer(world):
    assert recall(world, "P7 的后端服务端口是多少")["hits"] == []
    assert recall(world, "订单 OD99999999 退款了吗")["hits"] == []


def test_a_brand_new_entity_is_a_cue_of_the_first_recall_after_its_document_is_indexed(world):
    """The API's vocabulary follows the indexer's log (projections.search.vocab), no TTL."""
    settings, conn, es, ledger = world["settings"], world["conn"], world["es"], world["ledger"]
    ledger.assert_fact(
        FRESH,
        "project:P1",
        "project.backend_port",
        "P1 的后端服务端口是 8080",
        8080,
        aliases=["端口", "backend port"],
        entities=["P1"],
        valid_from=T0,
    )
    drain_all(settings, conn, es, load_embedder(settings))
    recall(world, "P1 后端端口", tenant=FRESH)  # the API process now holds a fresh copy of the vocabulary
    new = ledger.assert_fact(
        FRESH,
        "project:ZQ4242",
        "project.backend_port",
        "ZQ4242 的后端服务端口是 6543",
        6543,
        aliases=["端口", "后端服务地址", "backend port", "port"],
        entities=["ZQ4242"],
        valid_from=T0,
    )
    drain_all(settings, conn, es, load_embedder(settings))
    res = recall(world, "ZQ4242 的后端服务端口是多少", tenant=FRESH)
    assert "zq4242" in res["cues"]["known_entities"]  # the cached copy read what was indexed since it was loaded
    top = res["hits"][0]
    assert (top["memory_id"], top["value"], top["match"]["stage"]) == (new.memory_id, 6543, "exact"), res
    assert res["trace"]["embedding_computed"] is False


def test_superseded_value_is_never_returned_as_current_while_the_index_lags(world):
    settings, conn, es, ledger = world["settings"], world["conn"], world["es"], world["ledger"]
    aliases = ["端口", "backend port"]
    old = ledger.assert_fact(
        LAG,
        "project:P9",
        "project.backend_port",
        "P9 的后端服务端口是 8080",
        8080,
        aliases=aliases,
        entities=["P9"],
        valid_from=T0,
    )
    drain_all(settings, conn, es, load_embedder(settings))
    assert recall(world, "P9 后端端口", tenant=LAG)["hits"][0]["value"] == 8080

    new = ledger.assert_fact(
        LAG,
        "project:P9",
        "project.backend_port",
        "P9 的后端服务端口改成了 9999",
        9999,
        aliases=aliases,
        entities=["P9"],
        valid_from=T0 + timedelta(days=1),
    )
    # the outbox is NOT drained: the index still holds the old version as active
    doc = es.get(index=settings.es_index, id=old.version_id)["_source"]
    assert doc["status"] == "active" and not es.exists(index=settings.es_index, id=new.version_id)
    for mode in ("auto", "exact", "keyword", "semantic", "hybrid"):
        hits = recall(world, "P9 的后端服务端口", tenant=LAG, mode=mode)["hits"]
        assert all(h["value"] != 8080 for h in hits), (mode, hits)
        assert hits and hits[0]["value"] == 9999 and hits[0]["version_id"] == new.version_id, (mode, hits)
        assert hits[0]["event_id"] == new.event_id != new.version_id  # the producer's id, shown beside it
        if mode in ("keyword", "semantic"):  # the index's candidate, answered by the version that holds
            assert hits[0]["match"]["verified"] == {"candidate": old.version_id, "replaced_by": new.version_id}
        else:  # the exact stage asked PostgreSQL (recall.current): the version that holds is the candidate
            assert hits[0]["match"]["verified"] == {"candidate": new.version_id}, (mode, hits[0]["match"])
    # as of a time before the change, the old value is the right answer
    past = recall(world, "P9 后端端口", tenant=LAG, as_of=(T0 + timedelta(hours=1)).isoformat())["hits"]
    assert [h["value"] for h in past] == [8080]
    drain_all(settings, conn, es, load_embedder(settings))
    hits = recall(world, "P9 后端端口", tenant=LAG)["hits"]
    assert [h["value"] for h in hits] == [9999] and hits[0]["match"]["verified"] == {"candidate": new.version_id}


def test_time_words_narrow_events_to_their_range(world):
    settings, conn, es, ledger = world["settings"], world["conn"], world["es"], world["ledger"]
    now = datetime.now(UTC)
    recent = ledger.assert_fact(
        TIMED,
        "order:OD1001",
        "order.refund",
        "订单 OD1001 已退款，退款金额 30 元",
        30,
        kind="event",
        entities=["OD1001"],
        valid_from=now - timedelta(days=1),
    )
    older = ledger.assert_fact(
        TIMED,
        "order:OD1002",
        "order.refund",
        "订单 OD1002 已退款，退款金额 45 元",
        45,
        kind="event",
        entities=["OD1002"],
        valid_from=now - timedelta(days=10),
    )
    drain_all(settings, conn, es, load_embedder(settings))
    both = {h["memory_id"] for h in recall(world, "退款的订单", tenant=TIMED)["hits"]}
    assert both == {recent.memory_id, older.memory_id}
    for query in ("昨天退款的订单", "which orders were refunded yesterday"):
        res = recall(world, query, tenant=TIMED)
        assert [h["memory_id"] for h in res["hits"]] == [recent.memory_id], (query, res)
        assert res["cues"]["time"] is not None and res["cues"]["event_types"] == ["refund"]
    # an entity plus an event word is exact, and the time word still applies
    assert [h["value"] for h in recall(world, "OD1002 退款了吗", tenant=TIMED)["hits"]] == [45]
    assert recall(world, "OD1002 昨天退款了吗", tenant=TIMED)["hits"] == []


def test_two_tenants_never_see_each_other(world):
    acme = recall(world, "P1 后端端口", tenant=ACME, key="k-acme")["hits"]
    globex = recall(world, "P1 后端端口", tenant=GLOBEX, key="k-globex")["hits"]
    assert acme[0]["value"] == 8080 and globex[0]["value"] == 9090
    assert {h["memory_id"] for h in acme}.isdisjoint({h["memory_id"] for h in globex})
    assert all(h["value"] != 9090 for h in acme)
    # globex's secret is invisible to acme in every mode, and acme's key may not ask as globex
    for mode in ("auto", "keyword", "semantic", "hybrid"):
        assert recall(world, "黄金配方在哪里", tenant=ACME, key="k-acme", mode=mode)["hits"] == []
    assert recall(world, "黄金配方在哪里", tenant=GLOBEX, key="k-globex")["hits"][0]["value"] == "vault"
    r = world["client"].post("/v1/recall", json={"tenant": GLOBEX, "query": "P1 端口"}, headers={"X-API-Key": "k-acme"})
    assert r.status_code == 403 and "tenant" in r.text
    r = world["client"].post("/v1/recall", json={"tenant": ACME, "query": "P1 端口"})
    assert r.status_code == 401


def test_the_same_question_gets_the_same_answer(world):
    for query in ["P1 端口", "那个订单退款了吗", "Alice 早上喜欢喝什么"]:
        first = recall(world, query, top_k=10)
        for _ in range(3):
            again = recall(world, query, top_k=10)
            assert [(h["memory_id"], h["score"]) for h in again["hits"]] == [
                (h["memory_id"], h["score"]) for h in first["hits"]
            ]


def test_exact_hits_always_rank_above_fuzzy_ones(world):
    res = recall(world, "P1 后端端口", mode="hybrid", top_k=20)
    hits = res["hits"]
    stages = [h["match"]["stage"] for h in hits]
    first_fuzzy = next((i for i, s in enumerate(stages) if s != "exact"), len(stages))
    assert stages[0] == "exact" and all(s != "exact" for s in stages[first_fuzzy:])
    assert all(h["score"] >= 1 for h in hits[:first_fuzzy]) and all(h["score"] < 1 for h in hits[first_fuzzy:])
    assert res["trace"]["embedding_computed"] is True  # hybrid asks for the fuzzy stages too


def test_subject_and_filters_narrow_the_answer(world):
    hits = recall(world, "后端端口", subject="project:P2")["hits"]
    assert [h["value"] for h in hits] == [7000]
    assert recall(world, "P1 后端端口", filters={"kind": "preference"})["hits"] == []
    hits = recall(world, "用户 42 的座位偏好", filters={"kind": ["preference"], "source_type": "explicit"})["hits"]
    assert hits[0]["key"] == "preference.seat"


@pytest.mark.parametrize("mode", ["keyword", "auto"])
def test_an_entity_named_in_a_question_about_a_given_subject_narrows_nothing_more(world, mode):
    """With `subject` given, the subject is the scope: a known entity in the question (Alice, listed by another
    subject's fact) must not narrow it to memories listing that entity, or the subject's own answer is never found.
    Without a subject the entity still narrows: Bob's fact is not an answer about Alice."""
    question = "which payments team works with Alice?"
    hits = recall(world, question, subject="user:bob", mode=mode)["hits"]
    assert [h["subject"] for h in hits][:1] == ["user:bob"], hits
    assert "user:bob" not in [h["subject"] for h in recall(world, question, mode=mode)["hits"]]


def test_hits_carry_the_whole_fact_and_an_explanation(world):
    res = recall(world, "P1 后端端口")
    hit = res["hits"][0]
    for field in (
        "memory_id",
        "version_id",
        "event_id",
        "version",
        "subject",
        "key",
        "scope",
        "value",
        "content",
        "kind",
        "status",
        "valid_from",
        "valid_to",
        "observed_at",
        "source",
        "score",
        "match",
    ):
        assert field in hit
    assert hit["source"]["type"] == "explicit" and hit["status"] == "active" and hit["version"] == 1
    assert set(res["trace"]["stages_ms"]) >= {"cues", "exact", "verify_exact", "rerank"}
    assert res["cues"]["keys"] and res["cues"]["aliases"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tenant": ACME, "query": "x", "top_k": 0}, "top_k"),
        ({"tenant": ACME, "query": "x", "top_k": 101}, "top_k"),
        ({"tenant": ACME, "query": "x", "mode": "fuzzy"}, "mode"),
        ({"tenant": ACME}, "query"),
        ({"tenant": ACME, "query": "   "}, "query"),
        ({"tenant": ACME, "query": "x", "as_of": "2026-01-01T00:00:00"}, "as_of"),
        ({"tenant": ACME, "query": "x", "filters": {"kind": "fact"}}, "filters.kind"),
        ({"tenant": ACME, "query": "x", "filters": {"colour": "red"}}, "filters.colour"),
        ({"query": "x"}, "tenant"),
    ],
)
def test_bad_requests_get_422_naming_the_field(world, body, field):
    r = world["client"].post("/v1/recall", json=body, headers={"X-API-Key": "k-all"})
    assert r.status_code == 422
    assert field in [d["field"] for d in r.json()["detail"]], r.json()


def test_reindex_and_alias_switch_keep_the_answers(world):
    queries = ["P1 后端端口", "OD20241102 退款了吗", "那个订单退款了吗", "今天天气怎么样"]
    before = [[h["memory_id"] for h in recall(world, q)["hits"]] for q in queries]
    settings, conn, es = world["settings"], world["conn"], world["es"]
    reindex(settings, conn, es, load_embedder(settings))
    after = [[h["memory_id"] for h in recall(world, q)["hits"]] for q in queries]
    assert after == before
    report = orphans(settings, conn, es)
    assert (report["missing_in_es"], report["missing_in_pg"], report["outbox_pending"]) == (0, 0, 0)


def test_stats_report_no_orphans_after_catch_up(world):
    r = world["client"].get("/v1/stats/consistency", params={"tenant": ACME}, headers={"X-API-Key": "k-acme"})
    assert r.status_code == 200, r.text
    search = r.json()["search"]
    assert (search["missing_in_es"], search["missing_in_pg"], search["outbox_pending"]) == (0, 0, 0)
    assert search["pg_versions"] == search["es_documents"] == len(ACME_FACTS)


# --- end to end: SDK -> Kafka -> worker -> PostgreSQL -> `ledger indexer` -> Elasticsearch -> API ----------------


@pytest.fixture(scope="module")
def pipeline(base_settings):
    import subprocess
    import sys
    import tempfile

    from elasticsearch import Elasticsearch

    from tests.support import Worker, cleanup

    settings = base_settings.private(unique("e2e"), api_keys=KEYS)
    log = tempfile.NamedTemporaryFile(prefix="indexer-", suffix=".log", delete=False)
    worker = Worker(settings).start()
    indexer = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "indexer", "--poll", "0.1"],
        env=settings.child_environ(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with TestClient(create_app(settings)) as client:
            yield {"settings": settings, "client": client, "worker": worker, "indexer": indexer, "log": log.name}
    finally:
        indexer.terminate()
        indexer.wait(30)
        worker.stop()
        cleanup(settings)
        es = Elasticsearch(settings.es_url)
        for idx in es.indices.get(index=f"{settings.es_index}-*", allow_no_indices=True):
            es.indices.delete(index=idx, ignore_unavailable=True)
        es.close()


def test_end_to_end_from_kafka_update_and_erasure(pipeline):
    from producers.contract import EventType, MemoryEvent, Source, SourceType
    from tests.support import publish, wait_caught_up, wait_for

    settings, client = pipeline["settings"], pipeline["client"]

    def ask(query: str) -> dict:
        r = client.post("/v1/recall", json={"tenant": ACME, "query": query}, headers={"X-API-Key": "k-acme"})
        assert r.status_code == 200, r.text
        assert pipeline["indexer"].poll() is None, open(pipeline["log"]).read()[-3000:]
        return r.json()

    def fact(subject, key, content, value, day, aliases, entities=()):
        return MemoryEvent(
            type=EventType.ASSERTED,
            tenant=ACME,
            subject=subject,
            key=key,
            content=content,
            value=value,
            aliases=aliases,
            entities=list(entities),
            source=Source(type=SourceType.EXPLICIT, service="tests"),
            valid_from=T0 + timedelta(days=day),
            observed_at=T0 + timedelta(days=day),
        )

    publish(
        settings,
        [
            fact(
                "project:P1",
                "project.backend_port",
                "P1 的后端服务端口是 8080",
                8080,
                0,
                ["端口", "backend port"],
                ["P1"],
            ),
            fact("user:42", "preference.seat", "用户 42 喜欢靠窗的座位", "window", 0, ["座位偏好", "seat"]),
            fact(
                "user:alice",
                "preference.drink",
                "Alice prefers green tea in the morning",
                "tea",
                0,
                ["drink"],
                ["Alice"],
            ),
        ],
    )
    wait_caught_up(settings, timeout=90, worker=pipeline["worker"])

    # the index fills, and the tenant's vocabulary (cached a few seconds) learns P1 and its aliases
    def exact_answer() -> list:
        hits = ask("what port does the P1 backend use")["hits"]
        return hits if hits and hits[0]["match"]["stage"] == "exact" else []

    first = wait_for(exact_answer, timeout=90, what="an exact answer about P1's port")
    assert first[0]["value"] == 8080

    publish(settings, [fact("project:P1", "project.backend_port", "P1 的后端端口改为 9090", 9090, 1, ["端口"], ["P1"])])
    wait_caught_up(settings, timeout=60, worker=pipeline["worker"])
    # PostgreSQL has the new version now: whatever the indexer has done so far, 8080 is never current again
    for _ in range(5):
        assert all(h["value"] != 8080 for h in ask("P1 后端端口")["hits"])
    wait_for(lambda: [h["value"] for h in ask("P1 后端端口")["hits"]] == [9090], timeout=60, what="9090 indexed")

    publish(settings, [MemoryEvent(type=EventType.ERASED, tenant=ACME, subject="user:42")])
    wait_caught_up(settings, timeout=60, worker=pipeline["worker"])
    assert ask("用户 42 的座位偏好")["hits"] == []  # verification: the rows are gone even before the index is

    def caught_up() -> bool:
        params, headers = {"tenant": ACME}, {"X-API-Key": "k-acme"}
        r = client.get("/v1/stats/consistency", params=params, headers=headers).json()["search"]
        return (r["missing_in_es"], r["missing_in_pg"], r["outbox_pending"]) == (0, 0, 0)

    wait_for(caught_up, timeout=60, what="no orphans once the indexer caught up")
    assert ask("what does Alice drink in the morning")["hits"][0]["value"] == "tea"  # the other subjects stay


def test_unreachable_index_is_a_503_not_a_guess(world):
    dead = world["settings"].model_copy(update={"es_url": "http://127.0.0.1:9"})
    with TestClient(create_app(dead)) as client:
        client.app.state.es = client.app.state.es.options(max_retries=0, request_timeout=2)
        h = {"X-API-Key": "k-acme"}
        r = client.post("/v1/recall", json={"tenant": ACME, "query": "公司的 VPN 地址"}, headers=h)
        assert r.status_code == 503 and "search index unavailable" in r.text
        # an exact ask about an entity needs no index: PostgreSQL answers it (recall.current)
        r = client.post("/v1/recall", json={"tenant": ACME, "query": "P1 后端端口"}, headers=h)
    assert r.status_code == 200 and r.json()["hits"][0]["match"]["stage"] == "exact", r.text


def test_keyword_stage_matches_chinese_and_english_text(world):
    for query, fact in [
        ("staging database PostgreSQL", ("project:P1", "project.staging_db")),
        ("报销需要多少天内提交", ("company:acme", "policy.expense_deadline")),
        ("公司的 VPN 地址", ("company:acme", "it.vpn_address")),
    ]:
        res = recall(world, query, mode="keyword")
        assert res["hits"] and res["hits"][0]["memory_id"] == world["mids"][(ACME, *fact)], (query, res["hits"])
        assert res["hits"][0]["match"]["stage"] == "keyword" and "bm25" in res["hits"][0]["match"]["scores"]
        assert res["trace"]["embedding_computed"] is False


def test_a_temporary_preference_shadows_the_long_term_one_only_inside_its_window(world):
    settings, conn, es, ledger = world["settings"], world["conn"], world["es"], world["ledger"]
    style = {"aliases": ["回答风格", "answer style"], "entities": ["U9"], "kind": "preference"}
    ledger.assert_fact(
        TIMED, "user:U9", "preference.answer_style", "U9 喜欢简洁的回答", "concise", valid_from=T0, **style
    )
    ledger.assert_fact(
        TIMED,
        "user:U9",
        "preference.answer_style",
        "这次 U9 想要详细的回答",
        "detailed",
        valid_from=T0 + timedelta(days=1),
        valid_to=T0 + timedelta(days=2),
        **style,
    )
    drain_all(settings, conn, es, load_embedder(settings))

    def value_at(at: datetime | None) -> list:
        body = {"as_of": at.isoformat()} if at else {}
        return [h["value"] for h in recall(world, "U9 的回答风格", tenant=TIMED, **body)["hits"]]

    assert value_at(T0 + timedelta(hours=36)) == ["detailed"]
    assert value_at(T0 + timedelta(hours=12)) == ["concise"]
    assert value_at(T0 + timedelta(days=3)) == ["concise"]
    assert value_at(None) == ["concise"]


@pytest.mark.parametrize("as_of", ["0001-01-01T00:00:00Z", "0001-06-30T12:00:00Z", "9999-06-01T00:00:00Z",
                                   "9999-12-31T23:59:59.999999Z"])  # fmt: skip
def test_a_valid_time_in_the_first_or_last_year_is_answered(world, as_of: str) -> None:
    """Every valid time a request may give is answered, its time words read from it: year 1 and year 9999 too
    (their "next month" or "last year" lies outside what a time holds)."""
    for query in ("P1 backend port", "what changed yesterday", "anything this month", "the last 3 days"):
        assert recall(world, query, as_of=as_of)["trace"]["as_of"].startswith(as_of[:4])
        body = {"tenant": ACME, "subject": "project:P1", "question": query, "as_of": as_of}
        r = world["client"].post("/v1/context", json=body, headers={"X-API-Key": "k-all"})
        assert r.status_code == 200, r.text

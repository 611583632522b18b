"""Scope cues for facts and the subject (speaker) preference for episodes.

Scope: one fact (subject, key) holds a version in the default scope '' and one in `test`, each its own memory. A
question that names the test environment ("测试环境", "test environment", "QA") gets the test version first, with
the reason in its explanation; one that names no scope gets the default version first and the test one too; a
scope word for a scope the tenant does not have ("生产环境", "staging") changes nothing. Both versions say the
same words and the test one is newer, so without the preference recency would put it first either way.

Subject: two speakers say nearly the same thing; a question that names one gets that one's turn first and the
other's still in the results (a preference, not a filter); a question that names nobody is answered exactly as
with the preference off (`subject_preference` 1).

Against the real servers: facts through the PostgreSQL projection's recorder, drained into a private index, the
API over HTTP. Then pure unit tests of the detection and the ordering rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from projections.embedding import load_embedder
from projections.search.cues import Vocabulary, extract, scope_phrases
from projections.search.recall.prefer import prefer_scopes, scope_rank, subject_preference
from projections.search.recall.scoring import BAND
from tests.conftest import unique
from tests.support import RecorderWriter, drain_all, private_store

SCOPED, TALK = "scopeco", "talkco"
KEYS = {"k-cue": [SCOPED, TALK]}
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

DB = ("project:P1", "project.db_host")
DB_ALIASES = ["数据库地址", "database host"]
TURNS = [
    ("person:ana", "Ana: I started learning the cello last spring, the lessons are on Tuesdays."),
    ("person:ben", "Ben: I started learning the violin last spring, the lessons are on Tuesdays."),
    ("person:ana", "Ana: The bakery on the corner sells the best sourdough bread."),
    ("person:ben", "Ben: We painted the kitchen a pale green over the weekend."),
    ("person:ana", "Ana: My brother is moving to Lisbon next month."),
    ("person:ben", "Ben: The football match was cancelled because of the rain."),
]


@pytest.fixture(scope="module")
def world(base_settings):
    name = unique("cue")
    settings = base_settings.model_copy(
        update={
            "pg_schema": name,
            "es_index": f"{name}-facts",
            "topic": f"{name}.events",
            "access_topic": f"{name}.access",  # never created: the app's accesses are dropped
            "api_keys": KEYS,
        }
    )
    embedder = load_embedder(settings)
    with private_store(settings) as (conn, es):
        ledger = RecorderWriter(settings, conn)
        mids: dict[str, str] = {}
        for scope, content, value, hours in [
            ("", "P1 的数据库地址是 db.internal:5432", "db.internal:5432", 1),
            ("test", "P1 的数据库地址是 db-test:5432", "db-test:5432", 2),  # the same words: only the scope differs
        ]:
            e = ledger.assert_fact(
                SCOPED, *DB, content, value, aliases=DB_ALIASES, entities=["P1"], scope=scope,
                valid_from=T0 + timedelta(hours=hours),
            )  # fmt: skip
            mids[scope or "default"] = e.memory_id
        e = ledger.assert_fact(SCOPED, "project:P1", "project.owner", "P1 的负责人是 Alice", "Alice", entities=["P1"])
        mids["owner"] = e.memory_id
        e = ledger.assert_fact(SCOPED, "product:kettle", "product.code", "the kettle is sold as SKU0AC47", "SKU0AC47",
                               aliases=["SKU0AC47"])  # fmt: skip
        mids["sku"] = e.memory_id
        for i, (subject, content) in enumerate(TURNS):
            e = ledger.assert_fact(TALK, subject, None, content, kind="episodic", valid_from=T0 + timedelta(minutes=i))
            mids[f"turn{i}"] = e.memory_id
        drain_all(settings, conn, es, embedder)
        off = settings.model_copy(update={"subject_preference": 1.0})
        with TestClient(create_app(settings)) as client, TestClient(create_app(off)) as plain:
            yield {"client": client, "plain": plain, "mids": mids}
        ledger.close()


def recall(client: TestClient, tenant: str, query: str, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/recall", json={"tenant": tenant, "query": query, **body}, headers={"X-API-Key": "k-cue"})
    assert r.status_code == 200, r.text
    return r.json()


def db_hits(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for h in res["hits"] if h["key"] == DB[1]]


@pytest.mark.parametrize(
    "query",
    [
        "P1 测试环境的数据库地址是什么",
        "测试环境 P1 数据库地址",
        "what is the database host of P1 in the test environment",
    ],
)
def test_a_question_naming_the_test_environment_gets_the_test_version_first(world, query):
    res = recall(world["client"], SCOPED, query)
    assert res["cues"]["scopes"] == ["test"], res["cues"]
    first, second = db_hits(res)
    assert (first["memory_id"], first["scope"], first["value"]) == (world["mids"]["test"], "test", "db-test:5432")
    assert first["match"]["preferred"] == ["scope cue 'test'"], first["match"]
    assert first["match"]["cues"]["scope"] == "test"
    assert second["memory_id"] == world["mids"]["default"] and second["scope"] == ""  # still shown
    assert first["score"] >= second["score"]  # the score still orders the response


@pytest.mark.parametrize("query", ["P1 的数据库地址是什么", "what is the database host of P1"])
def test_without_a_scope_cue_the_default_version_comes_first_and_both_are_shown(world, query):
    res = recall(world["client"], SCOPED, query)
    assert res["cues"]["scopes"] == []
    first, second = db_hits(res)
    assert first["memory_id"] == world["mids"]["default"], res["hits"]  # though the test version is newer
    assert first["match"]["preferred"] == ["default scope"]
    assert second["memory_id"] == world["mids"]["test"] and not second["match"].get("preferred")
    assert first["score"] >= second["score"]


@pytest.mark.parametrize("word", ["生产环境", "staging"])
def test_a_scope_word_for_a_scope_the_tenant_lacks_changes_nothing(world, word):
    plain = recall(world["client"], SCOPED, "P1 的数据库地址")
    named = recall(world["client"], SCOPED, f"P1 {word} 的数据库地址")
    assert named["cues"]["scopes"] == []
    assert [h["memory_id"] for h in db_hits(named)] == [h["memory_id"] for h in db_hits(plain)]
    assert db_hits(named)[0]["memory_id"] == world["mids"]["default"]


def test_a_scope_filter_still_filters(world):
    res = recall(world["client"], SCOPED, "P1 的数据库地址", filters={"scope": ["test"]})
    assert [h["memory_id"] for h in db_hits(res)] == [world["mids"]["test"]]


def test_a_question_naming_a_speaker_prefers_that_speakers_turn_and_keeps_the_other(world):
    mids = world["mids"]
    for name, own, other in [("Ben", "turn1", "turn0"), ("Ana", "turn0", "turn1")]:
        res = recall(world["client"], TALK, f"Which instrument did {name} start learning last spring?", top_k=5)
        ids = [h["memory_id"] for h in res["hits"]]
        assert ids[0] == mids[own], (name, res["hits"])
        assert mids[other] in ids, (name, "the other speaker's turn is preferred less, not dropped", res["hits"])
        top, rest = res["hits"][0], res["hits"][ids.index(mids[other])]
        assert top["match"]["preferred"] == [f"subject cue '{name.lower()}'"], top["match"]
        assert top["match"]["cues"]["entities"] == [name.lower()]
        assert rest["match"]["scores"]["preference"] == pytest.approx(0.4) and not rest["match"].get("preferred")


def test_a_question_naming_nobody_is_answered_as_without_the_preference(world):
    # rerank off on both: each app loads its cross-encoder in the background, and only the preference is compared
    for query in ["Who started learning an instrument last spring?", "what happened to the football match"]:
        on = recall(world["client"], TALK, query, rerank=False)
        off = recall(world["plain"], TALK, query, rerank=False)
        assert on["hits"], query
        assert [(h["memory_id"], h["score"]) for h in on["hits"]] == [(h["memory_id"], h["score"]) for h in off["hits"]]
        assert all("preference" not in h["match"]["scores"] and not h["match"].get("preferred") for h in on["hits"])


# --- pure: detection and ordering ----------------------------------------------------------------------------


NOW = datetime(2026, 3, 2, tzinfo=UTC)
VOCAB = Vocabulary.build(
    subjects=["project:P1", "person:caroline"], key_aliases=[(DB[1], DB_ALIASES)], scopes=["", "test", "prod"]
)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("query", "scopes"),
    [
        ("测试环境的数据库地址是什么", ("test",)),
        ("what is the database host in the Test Environment", ("test",)),
        ("QA 数据库地址", ("test",)),
        ("生产环境的数据库地址", ("prod",)),
        ("database host in production", ("prod",)),
        ("线上和测试环境的数据库地址", ("prod", "test")),  # in the order the question names them
        ("staging database host", ()),  # the tenant has no staging scope
        ("预发环境的数据库地址", ()),
        ("数据库地址", ()),
    ],
)
def test_scope_words_are_detected_from_the_tenants_scopes_and_synonyms(query, scopes):
    cues = extract(query, VOCAB, NOW)
    assert cues.scopes == scopes
    assert cues.keys == (DB[1],)  # the scope words do not hide the alias
    if scopes:  # a scope word is explained: not a term (terms decide whether the exact stage answers)
        assert not {"测", "试", "环", "境", "线", "test", "environment", "production", "qa"} & set(cues.terms)


@pytest.mark.unit
def test_a_scope_is_named_by_its_own_name_and_its_groups_synonyms():
    assert scope_phrases("test")[0] == "test" and "测 试 环 境" in scope_phrases("test")
    assert "test environment" in scope_phrases("env-test") and scope_phrases("env-test")[0] == "env test"
    assert scope_phrases("customer-42") == ["customer 42"]  # no group: only its own name
    assert scope_phrases("") == []
    own = Vocabulary.build(scopes=["test", "qa"])  # two scopes share the test group: each keeps its own name
    assert own.scopes["qa"] == "qa" and own.scopes["test"] == "test" and own.scopes["测 试 环 境"] == "qa"
    assert extract("qa 的数据库", own, NOW).scopes == ("qa",)


@pytest.mark.unit
def test_the_incremental_vocabulary_learns_new_scopes():
    base = Vocabulary.build(subjects=["project:P1"])
    assert extract("测试环境", base, NOW).scopes == ()
    merged = base.merged(Vocabulary.build(scopes=["test"]))
    assert extract("测试环境", merged, NOW).scopes == ("test",)
    assert merged.merged(Vocabulary.build(scopes=["prod"])).scopes["生 产 环 境"] == "prod"


@pytest.mark.unit
def test_a_speaker_is_a_known_entity_through_its_subject_id():
    cues = extract("What did Caroline say about the adoption agencies?", VOCAB, NOW)
    assert cues.known_entities == ("caroline",)
    episode = {"kind": "episodic"}
    assert subject_preference(episode, ["caroline"], cues) == (1.0, ("subject cue 'caroline'",))
    assert subject_preference(episode, [], cues, 0.4) == (0.4, ())
    assert subject_preference({"kind": "state"}, [], cues) == (1.0, ())  # facts are narrowed, not preferred
    nobody = extract("What did they say about the adoption agencies?", VOCAB, NOW)
    assert nobody.known_entities == () and subject_preference(episode, [], nobody) == (1.0, ())


@dataclass
class _Hit:  # the fields of scoring.Scored that prefer_scopes reads and replaces
    row: dict[str, Any]
    score: float
    order: tuple[float, ...]
    preferred: tuple[str, ...] = ()


def _hits(*specs: tuple[str, str, str, float]) -> list[Any]:
    return [_Hit({"subject": s, "key": k, "scope": c}, score, (-score, 0.0)) for s, k, c, score in specs]


@pytest.mark.unit
def test_a_facts_versions_trade_places_by_scope_and_nothing_else_moves():
    hits = _hits(("p", "db", "test", 1.5), ("p", "owner", "", 1.4), ("p", "db", "", 1.3), ("p", "db", "prod", 0.5))
    out = prefer_scopes(hits, (), BAND)  # no cue: the default scope's version first
    assert [(h.row["key"], h.row["scope"], h.score) for h in out] == [
        ("db", "", 1.5),
        ("owner", "", 1.4),
        ("db", "test", 1.3),
        ("db", "prod", 0.5),  # a fuzzy hit never takes an exact hit's place
    ]
    assert out[0].preferred == ("default scope",) and out[2].preferred == () and out[1].preferred == ()
    named = prefer_scopes(hits, ("test",), BAND)
    assert [(h.row["scope"], h.score) for h in named] == [("test", 1.5), ("", 1.4), ("", 1.3), ("prod", 0.5)]
    assert named[0].preferred == ("scope cue 'test'",)
    assert [h.row["scope"] for h in prefer_scopes(hits[:1] + hits[2:3], ("prod",), BAND)] == ["", "test"]
    assert scope_rank("prod", ("prod",)) < scope_rank("", ("prod",)) < scope_rank("test", ("prod",))
    only_named = _hits(("p", "db", "test", 0.6), ("p", "db", "prod", 0.5))
    assert [h.row["scope"] for h in prefer_scopes(only_named, (), BAND)] == ["test", "prod"]  # no default: as before


@pytest.mark.parametrize("mode", ["exact", "auto"])
def test_an_id_shaped_alias_is_answered_exactly(world, mode):
    """An alias that looks like an id reaches its key's fact in the exact stage, though no entity is named that."""
    res = recall(world["client"], SCOPED, "what is SKU0AC47", mode=mode)
    assert res["cues"]["keys"] == ["product.code"] and res["cues"]["entities"] == [], res["cues"]
    first = res["hits"][0]
    assert (first["memory_id"], first["match"]["stage"]) == (world["mids"]["sku"], "exact"), res["hits"]

"""Embeddings per language: which model embeds a memory and a question, recorded and searched per model.

Against the real PostgreSQL and Elasticsearch: memories written by the recorder, drained by the indexer code,
asked through the API in-process. The language choice itself is a pure function (unit tests at the end).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from infra.model import install_model
from projections.embedding import Embedders, load_embedder
from projections.languages import DEFAULT_FIELD, EN_FIELD, has_script, slot_field, slots, text_slot
from projections.search.recall.model import Candidate
from projections.search.recall.stages import merge_by_offset
from projections.search.reindex import reindex
from tests.conftest import unique
from tests.support import RecorderWriter as Ledger
from tests.support import drain_all, private_store

ZH = "BAAI/bge-small-zh-v1.5"
EN = "BAAI/bge-small-en-v1.5-int8"
EN_SWITCHED = "BAAI/bge-small-zh-v1.5-int8"  # another model for English text, of another dimension (512, not 384)
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
MIXED, ENGLISH_ONLY = "mixed", "english"
KEYS = {"k": [MIXED, ENGLISH_ONLY]}

FACTS = {
    MIXED: [
        ("person:bob", "profile.team", "Bob works on the payments team", ["team"]),
        ("person:dave", "preference.editor", "Dave uses Neovim as his editor", ["editor"]),
        ("user:42", "profile.city", "用户 42 住在杭州", ["城市"]),
        ("user:42", "preference.seat", "用户 42 喜欢靠窗的座位", ["座位偏好"]),
    ],
    ENGLISH_ONLY: [
        ("person:carol", "health.allergy", "Carol is allergic to peanuts", ["allergy"]),
        ("person:erin", "profile.birthday", "Erin's birthday is on the 3rd of March", ["birthday"]),
    ],
}


def _world(base_settings, **update):
    name = unique("el")
    settings = base_settings.model_copy(
        update={
            "pg_schema": name,
            "es_index": f"{name}-facts",
            "topic": f"{name}.events",
            "access_topic": f"{name}.access",
            "api_keys": KEYS,
            "embed_model": ZH,
            "embed_model_en": EN,
            **update,
        }
    )
    for name in (settings.embed_model, settings.embed_model_en):  # ZH is no longer the default
        install_model(settings, name)  # from Maven on a fresh machine, as `infra up model` does
    return settings


def _write(settings, conn, es) -> dict[str, str]:
    ledger = Ledger(settings, conn)
    vids: dict[str, str] = {}
    for tenant, facts in FACTS.items():
        for i, (subject, key, content, aliases) in enumerate(facts):
            entities = [subject.split(":")[1].title()] if subject.startswith("person:") else None
            ledger.assert_fact(
                tenant, subject, key, content, aliases=aliases, entities=entities, valid_from=T0 + timedelta(hours=i)
            )
    ledger.close()
    drain_all(settings, conn, es, load_embedder(settings))
    for row in conn.execute("SELECT content, version_id FROM fact_versions"):
        vids[row[0]] = row[1]
    return vids


@pytest.fixture(scope="module")
def world(base_settings):
    settings = _world(base_settings)
    with private_store(settings) as (conn, es):
        vids = _write(settings, conn, es)
        with TestClient(create_app(settings)) as client:
            yield {"settings": settings, "conn": conn, "es": es, "client": client, "vids": vids}


def _source(es, settings, version_id: str) -> dict:
    return es.get(index=settings.es_index, id=version_id, source_exclude_vectors=False)["_source"]


def _doc(world, content: str) -> dict:
    return _source(world["es"], world["settings"], world["vids"][content])


def _semantic(client, tenant: str, query: str) -> dict:
    r = client.post(
        "/v1/recall",
        json={"tenant": tenant, "query": query, "mode": "semantic", "explain": True},
        headers={"X-API-Key": "k"},
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_each_document_records_the_models_of_its_vectors(world):
    en = _doc(world, "Bob works on the payments team")
    zh = _doc(world, "用户 42 住在杭州")
    # English text: the English model's vector first, and the default model's (embed_cross_language)
    assert en["embed_model"] == [EN, ZH]
    assert len(en[EN_FIELD]) == 384 and len(en[DEFAULT_FIELD]) == 512
    assert zh["embed_model"] == [ZH]
    assert EN_FIELD not in zh and len(zh[DEFAULT_FIELD]) == 512


def test_an_english_question_is_embedded_by_the_english_model(world):
    body = _semantic(world["client"], ENGLISH_ONLY, "what is Carol allergic to")
    assert body["trace"]["embedding_models"] == [EN]  # no Chinese memory in this tenant: one pass
    assert body["hits"][0]["content"] == "Carol is allergic to peanuts"


def test_an_english_question_over_chinese_memories_also_asks_the_chinese_model(world):
    body = _semantic(world["client"], MIXED, "which team is Bob on")
    assert body["trace"]["embedding_models"] == [EN, ZH]
    assert body["hits"][0]["content"] == "Bob works on the payments team"
    body = _semantic(world["client"], MIXED, "which city does the user live in")
    assert "用户 42 住在杭州" in [h["content"] for h in body["hits"]]  # found by the Chinese model's pass


def test_a_chinese_question_is_embedded_by_the_chinese_model(world):
    body = _semantic(world["client"], MIXED, "用户住在哪个城市")
    assert body["trace"]["embedding_models"] == [ZH]
    assert body["hits"][0]["content"] == "用户 42 住在杭州"
    # the English memories hold a vector of the default model too: a Chinese question still reaches them (whether
    # it is accepted is the cut-offs' business: fusion.accept_semantic)
    body = _semantic(world["client"], MIXED, "Bob 在哪个团队工作")
    found = [c["version_id"] for c in body["trace"]["candidates"]["semantic"]]
    assert world["vids"]["Bob works on the payments team"] in found


def test_without_cross_language_english_text_has_the_english_vector_only(base_settings):
    settings = _world(base_settings, embed_cross_language=False)
    with private_store(settings) as (conn, es):
        vids = _write(settings, conn, es)
        doc = _source(es, settings, vids["Bob works on the payments team"])
        assert doc["embed_model"] == [EN] and DEFAULT_FIELD not in doc
        with TestClient(create_app(settings)) as client:
            body = _semantic(client, MIXED, "which team is Bob on")
            assert body["trace"]["embedding_models"] == [EN]


def test_a_reindex_after_switching_the_english_model_re_embeds_and_records_it(base_settings):
    settings = _world(base_settings)
    with private_store(settings) as (conn, es):
        vids = _write(settings, conn, es)
        switched = settings.model_copy(update={"embed_model_en": EN_SWITCHED})
        install_model(switched, EN_SWITCHED)
        report = reindex(switched, conn, es, load_embedder(switched))
        assert report["documents"] == len(vids)
        doc = _source(es, settings, vids["Carol is allergic to peanuts"])
        assert doc["embed_model"] == [EN_SWITCHED, ZH] and len(doc[EN_FIELD]) == 512
        assert _source(es, settings, vids["用户 42 住在杭州"])["embed_model"] == [ZH]
        with TestClient(create_app(switched)) as client:
            body = _semantic(client, ENGLISH_ONLY, "what is Carol allergic to")
            assert body["trace"]["embedding_models"] == [EN_SWITCHED]
            assert body["hits"] and body["hits"][0]["content"] == "Carol is allergic to peanuts"


# --- the language choice: pure ---------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "slot"),
    [
        ("what does Alice drink in the morning", "en"),
        ("Café crème, s'il vous plaît", "en"),  # Latin script, accents included
        ("用户 42 住在杭州", "default"),
        ("项目 Q7 的后端服务端口是 8080", "default"),  # mixed, mostly Han
        ("Alice 早上喜欢喝什么", "default"),
        ("deploy the new 后端 service to prod", "en"),  # mixed, mostly Latin words
        ("", "default"),
        ("   ", "default"),
        ("?!… 12:30 — 8080", "default"),  # punctuation and digits only
    ],
)
def test_text_slot(text, slot):
    assert text_slot(text) == slot


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "script"), [("hi", True), ("后端", True), (";)", False), ("", False), ("12:30", False)]
)
def test_has_script(text, script):
    assert has_script(text) is script


@pytest.mark.unit
def test_one_model_for_both_languages_is_one_field(base_settings):
    one = base_settings.model_copy(update={"embed_model": ZH, "embed_model_en": ZH})
    two = base_settings.model_copy(update={"embed_model": ZH, "embed_model_en": EN})
    assert slots(one) == ("default",) and slot_field(one, "en") == DEFAULT_FIELD
    assert slots(two) == ("default", "en") and slot_field(two, "en") == EN_FIELD


@pytest.mark.unit
def test_a_lone_embedder_that_is_not_the_default_embeds_everything_in_the_default_field(base_settings):
    class Fake:
        name, dim = "fake", 2

        def embed(self, texts):
            import numpy as np

            return np.ones((len(texts), 2), dtype=np.float32)

    out = Embedders(base_settings, Fake()).vectors(["hello there", "你好"])  # type: ignore[arg-type]
    assert out == [[(DEFAULT_FIELD, "fake", [1.0, 1.0])], [(DEFAULT_FIELD, "fake", [1.0, 1.0])]]


@pytest.mark.unit
def test_lists_of_two_models_merge_by_cosine_less_each_models_offset():
    en = [Candidate("e1", "m", 0.80), Candidate("e2", "m", 0.66), Candidate("x", "m", 0.60)]
    zh = [Candidate("z1", "m", 0.70), Candidate("x", "m", 0.58)]
    # en less 0.07: 0.73, 0.59, 0.53; zh: 0.70, 0.58
    assert [c.version_id for c in merge_by_offset([(en, 0.07), (zh, 0.0)], 10)] == ["e1", "z1", "e2", "x"]
    assert [c.score for c in merge_by_offset([(en, 0.07), (zh, 0.0)], 2)] == [0.80, 0.70]  # own cosines kept

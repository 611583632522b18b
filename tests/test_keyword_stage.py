"""The keyword stage keeps what plain BM25 finds, against the real servers.

A fixture of English conversation turns (episodic memories, one per turn) is written through the PostgreSQL
projection's recorder and drained into a private index. For each question, plain OR-semantics BM25 over the same
texts (the shared dev-set harness's few lines: [a-z0-9]+ tokens, k1=1.2, b=0.75, no stemming)
ranks the turns for the question's words without the stage's stop words (on 20 turns a "did" or "are" that one
turn happens to hold outweighs content words; the stage drops such words on purpose: cues.extract). Every turn
it puts in its top 3 (with a score above 0) must be in the keyword stage's top 10 (`mode: keyword`, over HTTP).
And the stage stems on both sides: a question with "hiking" finds the turn that says "hiked", which BM25 misses.
Then `ledger reindex` fills the stemmed field for documents of an index written before the field existed.
"""

from __future__ import annotations

import collections
import math
import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from projections.embedding import load_embedder
from projections.search.cues import Vocabulary, extract
from projections.search.mapping import ensure_index, index_body, physical_indices
from projections.search.reindex import reindex
from projections.search.stemming import STEM_FIELD, stem_text, stems
from tests.conftest import unique
from tests.support import RecorderWriter, drain_all, private_store

TENANT = "kwco"
KEYS = {"k-kw": [TENANT]}
T0 = datetime(2025, 5, 3, 18, 0, tzinfo=UTC)

TURNS = [
    ("person:ana", "Ana: We hiked up to the waterfall on Saturday, my legs still hurt."),
    ("person:ben", "Ben: Wow, that trail is steep. Did the dogs come along?"),
    ("person:ana", "Ana: Only Max, he loves the mountains more than anyone."),
    ("person:ben", "Ben: I finished two paintings of the lake this week."),
    ("person:ana", "Ana: Your painting of the sunrise is still my favourite."),
    ("person:ben", "Ben: Thanks! The pottery class starts again next month."),
    ("person:ana", "Ana: I signed up for a marathon, training starts in June."),
    ("person:ben", "Ben: Running that far sounds brutal, good luck with the training."),
    ("person:ana", "Ana: My sister adopted a kitten from the shelter."),
    ("person:ben", "Ben: Adoption agencies were so helpful when we looked into adopting."),
    ("person:ana", "Ana: The camping trip by the river was the best part of the summer."),
    ("person:ben", "Ben: We camped near the river too, the kids caught three fish."),
    ("person:ana", "Ana: I'm reading a book about the history of jazz."),
    ("person:ben", "Ben: My grandfather played jazz piano in clubs for years."),
    ("person:ana", "Ana: We are renovating the kitchen, new cabinets arrive soon."),
    ("person:ben", "Ben: The bakery downtown sells amazing sourdough bread."),
    ("person:ana", "Ana: I volunteered at the animal shelter again last weekend."),
    ("person:ben", "Ben: I'd like to volunteer there as well, is it far?"),
    ("person:ana", "Ana: My phone broke, so I bought a new one with a better camera."),
    ("person:ben", "Ben: Photos of the sunset from the pier look great with a good camera."),
]

QUESTIONS = [
    "What did the sister adopt from the shelter?",
    "Which trail did they go hiking on?",
    "What are the paintings of?",
    "Where did they go camping?",
    "What instrument did the grandfather play in jazz clubs?",
    "What is being renovated in the kitchen?",
    "Who is training for a marathon and when does it start?",
    "What does the downtown bakery sell?",
    "Who volunteers at the animal shelter?",
    "What happened to the phone camera?",
]

# question -> a turn that only an inflected form of a question word matches (BM25 as written misses it)
INFLECTED = {
    "Which trail did they go hiking on?": 0,  # "hiked"
    "What are the paintings of?": 4,  # "painting"
    "Where did they go camping?": 11,  # "camped"
    "Who volunteers at the animal shelter?": 17,  # "volunteer"
    "What did the sister adopt from the shelter?": 9,  # "adopting", "adoption"
}


def _toks(s: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", s.lower())


def asked(question: str) -> str:
    """The question's words as the stage asks them: without its stop words ("what", "did", "the")."""
    return extract(question, Vocabulary(), T0).text


def bm25_top(docs: list[str], query: str, k: int, k1: float = 1.2, b: float = 0.75) -> list[int]:
    """run_dev.py's baseline: Okapi BM25, OR semantics, over the texts as written; only scores above 0."""
    query = asked(query)
    toks = [_toks(d) for d in docs]
    avg = sum(map(len, toks)) / len(toks)
    df = collections.Counter(w for d in toks for w in set(d))
    idf = {w: math.log(1 + (len(toks) - c + 0.5) / (c + 0.5)) for w, c in df.items()}
    tfs = [collections.Counter(d) for d in toks]
    scores = []
    for i, tf in enumerate(tfs):
        norm = k1 * (1 - b + b * len(toks[i]) / avg)
        scores.append(sum(idf[w] * tf[w] * (k1 + 1) / (tf[w] + norm) for w in _toks(query) if w in tf))
    return [i for i in sorted(range(len(docs)), key=lambda i: -scores[i])[:k] if scores[i] > 0]


@pytest.mark.unit
def test_stems_meet_across_inflections_and_skip_han_text():
    assert stems("hiking hiked") == ["hike", "hike"]
    assert stems("Paintings, painting") == ["paint", "paint"]
    assert stems("Caroline's adoption agencies") == stems("caroline adopting agency") == ["carolin", "adopt", "agenc"]
    assert stem_text("P1 的后端服务端口是 8080") == "p1 8080"
    assert stem_text("后端端口") is None and stem_text(None) is None


@pytest.mark.unit
def test_the_mapping_has_the_stemmed_field_under_a_core_analyzer():
    prop = index_body(4)["mappings"]["properties"][STEM_FIELD]
    assert prop == {"type": "text", "analyzer": "whitespace"}  # built into the server: no plugin needed


@pytest.fixture(scope="module")
def world(base_settings):
    name = unique("kw")
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
        mids = []
        for i, (subject, content) in enumerate(TURNS):
            e = ledger.assert_fact(
                TENANT, subject, None, content, kind="episodic", valid_from=T0 + timedelta(minutes=i)
            )
            mids.append(e.memory_id)
        drain_all(settings, conn, es, embedder)
        with TestClient(create_app(settings)) as client:
            yield {"settings": settings, "conn": conn, "es": es, "client": client, "mids": mids, "embedder": embedder}
        ledger.close()


def keyword_ids(world, query: str) -> list[str]:
    r = world["client"].post(
        "/v1/recall",
        json={"tenant": TENANT, "query": query, "top_k": 10, "mode": "keyword"},
        headers={"X-API-Key": "k-kw"},
    )
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert all(h["match"]["stage"] == "keyword" for h in hits), hits
    return [h["memory_id"] for h in hits]


def test_keyword_stage_returns_every_bm25_top3_turn_in_its_top10(world):
    docs = [content for _, content in TURNS]
    missed = []
    for q in QUESTIONS:
        got = keyword_ids(world, q)
        want = bm25_top(docs, q, 3)
        assert want, q  # the fixture gives BM25 something to find for every question
        missed += [(q, docs[i]) for i in want if world["mids"][i] not in got]
    assert not missed, missed


def test_keyword_stage_matches_inflected_forms_that_bm25_misses(world):
    docs = [content for _, content in TURNS]
    for q, turn in INFLECTED.items():
        assert turn not in bm25_top(docs, q, 3), (q, "the fixture must show what stemming adds")
        assert world["mids"][turn] in keyword_ids(world, q), (q, docs[turn])


def test_reindex_fills_the_stemmed_field_of_documents_indexed_before_it(world):
    settings, es, conn = world["settings"], world["es"], world["conn"]
    (old,) = physical_indices(es, settings.es_index)
    # documents written by an indexer that knew no stemmed field: drop the field from every one
    hits = es.search(index=old, query={"match_all": {}}, size=len(TURNS))["hits"]["hits"]  # no _update_by_query here
    for h in hits:
        es.index(index=old, id=h["_id"], document={k: v for k, v in h["_source"].items() if k != STEM_FIELD})
    es.indices.refresh(index=old)
    assert es.count(index=old, query={"exists": {"field": STEM_FIELD}})["count"] == 0
    assert ensure_index(es, settings, world["embedder"].dim) == old  # an existing index keeps its name
    reindex(settings, conn, es, world["embedder"])
    (new,) = physical_indices(es, settings.es_index)
    assert new != old
    assert es.count(index=new, query={"exists": {"field": STEM_FIELD}})["count"] == len(TURNS)
    src = es.search(index=new, query={"term": {"memory_id": world["mids"][0]}})["hits"]["hits"][0]["_source"]
    assert src[STEM_FIELD] == stem_text(TURNS[0][1])
    assert world["mids"][0] in keyword_ids(world, "Which trail did they go hiking on?")


def test_an_index_created_before_the_stemmed_field_gets_it_in_its_mapping(base_settings):
    settings = base_settings.private(unique("kwmap"))
    with private_store(settings) as (_, es):
        body = index_body(4)
        del body["mappings"]["properties"][STEM_FIELD]  # the mapping as it was before this field
        es.indices.create(index=f"{settings.es_index}-old", **body)
        es.indices.put_alias(index=f"{settings.es_index}-old", name=settings.es_index)
        assert ensure_index(es, settings, 4) == f"{settings.es_index}-old"
        props = es.indices.get_mapping(index=settings.es_index)[f"{settings.es_index}-old"]["mappings"]["properties"]
        assert props[STEM_FIELD] == {"type": "text", "analyzer": "whitespace"}  # so a new document can carry it

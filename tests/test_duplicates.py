"""Near-duplicate episodes (projections.search.duplicates): linked when their vectors are stored.

Against the real servers: a re-import of the same turns (other event ids, later batches) links every copy to its
original's group, a copy in the same batch links too, the same words from another subject and a different thing
said do not; nothing is deleted; the documents carry the group and /v1/stats counts it; an erasure of the group's
first episode leaves the others whole.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from producers.contract import EventType, MemoryEvent
from projections.embedding import load_embedder
from projections.search.duplicates import COSINE_MIN, TEXT_MIN, is_duplicate, text_similarity
from tests.conftest import unique
from tests.support import RecorderWriter as Ledger
from tests.support import drain_all, private_store

TENANT, KEY = "dups", "k-dups"
H = {"X-API-Key": KEY}
T0 = datetime(2026, 4, 1, 18, 0, tzinfo=UTC)
TURNS = [
    "Ann: I adopted a grey kitten named Pixel last weekend!",
    "Ann: We are driving to the coast for the long weekend.",
    "Ann: My sister finally finished her thesis on glaciers.",
]


@pytest.fixture(scope="module")
def embedder(base_settings):
    return load_embedder(base_settings)


@pytest.fixture
def store(base_settings):
    settings = base_settings.private(unique("dup"), api_keys={KEY: [TENANT]})
    with private_store(settings) as (conn, es), Ledger(settings, conn) as ledger:
        yield settings, conn, es, ledger


def _episode(ledger: Ledger, subject: str, text: str, at: datetime):
    return ledger.assert_fact(TENANT, subject, None, text, kind="episodic", valid_from=at)


def _links(conn) -> dict[str, str]:
    return dict(conn.execute("SELECT version_id, group_id FROM episode_links").fetchall())


def test_a_reimport_links_every_copy_to_its_original_and_deletes_nothing(store, embedder):
    settings, conn, es, ledger = store
    originals = [_episode(ledger, "person:ann", t, T0 + timedelta(seconds=i)) for i, t in enumerate(TURNS)]
    drain_all(settings, conn, es, embedder)
    assert _links(conn) == {}
    copies = [_episode(ledger, "person:ann", t, T0 + timedelta(days=30, seconds=i)) for i, t in enumerate(TURNS)]
    twice = _episode(ledger, "person:ann", TURNS[0], T0 + timedelta(days=31))  # and the first said once more
    other = _episode(ledger, "person:bob", TURNS[0].replace("Ann", "Bob"), T0 + timedelta(days=31))
    drain_all(settings, conn, es, embedder)
    links = _links(conn)
    expected = {c.version_id: o.version_id for c, o in zip(copies, originals, strict=True)}
    expected[twice.version_id] = originals[0].version_id
    assert links == expected  # Bob's line (another subject) and the originals are in no group as members
    assert other.version_id not in links
    measures = conn.execute("SELECT min(cosine), min(text_similarity) FROM episode_links").fetchone()
    assert measures[0] >= COSINE_MIN and measures[1] >= TEXT_MIN
    assert es.count(index=settings.es_index)["count"] == 8  # nothing deleted
    doc = es.get(index=settings.es_index, id=twice.version_id)["_source"]
    assert doc["episode_group"] == originals[0].version_id
    assert "episode_group" not in es.get(index=settings.es_index, id=originals[0].version_id)["_source"]
    with TestClient(create_app(settings)) as client:
        search = client.get("/v1/stats", headers=H, params={"tenant": TENANT}).json()["search"]
        assert (search["duplicate_groups"], search["duplicate_episodes"]) == (3, 4)
        group = {originals[0].version_id, copies[0].version_id, twice.version_id}
        for mode in ("keyword", "semantic", "auto"):  # one hit for the group, the others in its explanation
            r = client.post(
                "/v1/recall",
                headers=H,
                json={"tenant": TENANT, "query": "Did Ann adopt a grey kitten called Pixel?", "mode": mode},
            )
            hits = r.json()["hits"]
            in_group = [h for h in hits if h["version_id"] in group]
            assert len(in_group) == 1, (mode, [h["content"] for h in hits])
            top = in_group[0]
            assert set(top["match"]["duplicates"]) == group - {top["version_id"]}, mode
            assert any(h["version_id"] == other.version_id for h in hits) or mode != "keyword"  # Bob's is his own


def test_copies_in_one_batch_link_to_the_first_of_them(store, embedder):
    settings, conn, es, ledger = store
    first = _episode(ledger, "person:ann", TURNS[1], T0)
    second = _episode(ledger, "person:ann", TURNS[1], T0 + timedelta(hours=1))
    different = _episode(ledger, "person:ann", TURNS[2], T0 + timedelta(hours=2))
    drain_all(settings, conn, es, embedder)
    assert _links(conn) == {second.version_id: first.version_id}
    assert different.version_id not in _links(conn)


def test_erasing_a_subject_drops_its_links_and_leaves_other_groups(store, embedder):
    settings, conn, es, ledger = store
    _episode(ledger, "person:ann", TURNS[0], T0)
    _episode(ledger, "person:ann", TURNS[0], T0 + timedelta(days=1))
    b1 = _episode(ledger, "person:bob", TURNS[2].replace("Ann", "Bob"), T0)
    b2 = _episode(ledger, "person:bob", TURNS[2].replace("Ann", "Bob"), T0 + timedelta(days=1))
    drain_all(settings, conn, es, embedder)
    assert len(_links(conn)) == 2
    ledger.publish(MemoryEvent(type=EventType.ERASED, tenant=TENANT, subject="person:ann"))
    drain_all(settings, conn, es, embedder)
    assert _links(conn) == {b2.version_id: b1.version_id}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("a", "b", "sim"),
    [
        ("Ann: I adopted a kitten!", "ann: i ADOPTED a kitten", 1.0),
        ("Ann: I adopted a kitten!", "Ann: I adopted a puppy!", 4 / 6),
        ("用户 42 住在杭州", "用户 42 住在杭州。", 1.0),
        ("用户 42 住在杭州", "用户 43 住在上海", 4 / 10),
        ("", "", 1.0),
        ("?!", "…", 0.0),
    ],
)
def test_text_similarity(a, b, sim):
    assert text_similarity(a, b) == pytest.approx(sim)


@pytest.mark.unit
def test_both_measures_must_agree():
    assert is_duplicate(0.99, 0.9)
    assert not is_duplicate(0.99, 0.5)  # close in meaning, other words: not the same thing said again
    assert not is_duplicate(0.90, 1.0)  # the same words, far apart in the model (never happens with one model)


def test_the_same_episode_in_another_tenant_is_never_linked(store, embedder):
    """Tenants never meet: the same subject saying the same words in two tenants, in one batch and across two."""
    settings, conn, es, ledger = store
    first = ledger.assert_fact(TENANT, "person:ann", None, TURNS[0], kind="episodic", valid_from=T0)
    other = ledger.assert_fact("dups-other", "person:ann", None, TURNS[0], kind="episodic", valid_from=T0)
    drain_all(settings, conn, es, embedder)
    later = ledger.assert_fact(
        "dups-other", "person:ann", None, TURNS[0], kind="episodic", valid_from=T0 + timedelta(days=1)
    )
    drain_all(settings, conn, es, embedder)
    assert _links(conn) == {later.version_id: other.version_id}  # its own tenant's copy, never `first`
    assert first.version_id not in set(_links(conn).values())

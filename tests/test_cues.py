"""Cue extraction rules (pure): entity ids, keys through aliases, time words, event types."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from projections.search.cues import (
    Vocabulary,
    canonical,
    embedding_text,
    event_types_in,
    extract,
    key_phrases,
    normalize_entity,
    subject_ids,
    units,
)
from projections.search.documents import build_doc

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 25, 15, 30, tzinfo=UTC)  # a Wednesday

VOCAB = Vocabulary.build(
    entities=["P1", "OD20241102", "Alice"],
    subjects=["project:P1", "user:42", "order:OD20241102"],
    key_aliases=[
        ("project.backend_port", ["端口", "后端服务地址", "backend port", "port"]),
        ("project.frontend_port", ["端口", "前端端口", "frontend port"]),
        ("preference.seat", ["座位", "seat"]),
    ],
)


def test_units_split_han_characters_and_latin_words():
    assert units("P1的后端-Port") == ["p1", "的", "后", "端", "port"]
    assert canonical("Backend_Port") == canonical("backend port") == "backend port"
    assert canonical("ＰＯＲＴ") == "port"  # full width folds to ASCII


def test_entity_normalization_is_case_and_width_insensitive():
    assert normalize_entity("Ｐ１") == normalize_entity("p1") == "p1"
    assert subject_ids("project:P1") == ["project:p1", "p1"]
    assert subject_ids("alice") == ["alice"]


def test_key_phrases_turn_dots_and_underscores_into_words():
    assert key_phrases("project.backend_port") == ["project backend port", "backend port"]
    assert key_phrases("port") == ["port"]
    assert key_phrases(None) == []


@pytest.mark.parametrize(
    "query",
    ["P1 的后端服务端口是多少", "P1 后端端口", "what port does the P1 backend use", "backend port of project P1"],
)
def test_phrasings_of_one_question_give_the_same_entity_and_key(query):
    cues = extract(query, VOCAB, NOW)
    assert "p1" in cues.known_entities or "project:p1" in cues.known_entities
    assert "project.backend_port" in cues.keys


def test_longest_alias_wins_over_the_shorter_one_inside_it():
    cues = extract("P1 前端端口", VOCAB, NOW)
    assert cues.keys == ("project.frontend_port",)  # 端口 alone would also name the backend port
    assert cues.alias_matches == (("前 端 端 口", ("project.frontend_port",)),)


def test_id_shaped_tokens_are_entities_even_when_unknown():
    cues = extract("订单 OD99999 和 user:7 呢", VOCAB, NOW)
    assert set(cues.entities) == {"od99999", "user:7"}
    assert cues.known_entities == ()
    assert set(cues.unknown_entities) == {"od99999", "user:7"}


def test_known_ids_without_digits_and_bare_subject_ids_are_found():
    assert extract("what does Alice drink", VOCAB, NOW).known_entities == ("alice",)
    assert "user:42" in extract("user:42 喜欢什么座位", VOCAB, NOW).known_entities


def test_a_short_bare_number_is_not_taken_for_a_subject():
    assert extract("报销需要在 42 天内提交吗", VOCAB, NOW).known_entities == ()
    assert Vocabulary.build(entities=["42"]).entities == {"42": "42"}  # listed as an entity: it is one


def test_no_cues_in_an_unrelated_question():
    cues = extract("what is the capital of France", VOCAB, NOW)
    assert cues.empty
    assert cues.terms == ("capital", "france")


@pytest.mark.parametrize(
    ("words", "start", "end"),
    [
        ("昨天", datetime(2026, 11, 24, tzinfo=UTC), datetime(2026, 11, 25, tzinfo=UTC)),
        ("yesterday", datetime(2026, 11, 24, tzinfo=UTC), datetime(2026, 11, 25, tzinfo=UTC)),
        ("今天", datetime(2026, 11, 25, tzinfo=UTC), datetime(2026, 11, 26, tzinfo=UTC)),
        ("上周", datetime(2026, 11, 16, tzinfo=UTC), datetime(2026, 11, 23, tzinfo=UTC)),
        ("last week", datetime(2026, 11, 16, tzinfo=UTC), datetime(2026, 11, 23, tzinfo=UTC)),
        ("上个月", datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)),
        ("去年", datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)),
        ("3 天前", datetime(2026, 11, 22, tzinfo=UTC), datetime(2026, 11, 23, tzinfo=UTC)),
        ("2 days ago", datetime(2026, 11, 23, tzinfo=UTC), datetime(2026, 11, 24, tzinfo=UTC)),
    ],
)
def test_time_words_become_ranges(words, start, end):
    cues = extract(f"OD20241102 {words} 退款了吗", VOCAB, NOW)
    assert cues.time is not None
    assert (cues.time.start, cues.time.end) == (start, end)


def test_event_type_words_in_both_languages_map_to_one_type():
    assert event_types_in("订单已退款") == ["refund"]
    assert event_types_in("the order was refunded") == ["refund"]
    assert extract("OD20241102 退款了吗", VOCAB, NOW).event_types == ("refund",)
    assert event_types_in("P1 的后端服务端口是 8080") == []


def test_write_side_stores_what_the_read_side_looks_up():
    row = {
        "version_id": "v1",
        "memory_id": "m1",
        "tenant": "acme",
        "subject": "order:OD20241102",
        "key": "order.status",
        "scope": "",
        "kind": "state",
        "value": "refunded",
        "content": "订单 OD20241102 已退款",
        "entities": ["OD20241102"],
        "aliases": ["订单状态", "Order-Status"],
        "tags": [],
        "source": {"type": "explicit"},
        "confidence": 1.0,
        "importance": 0.5,
        "observed_at": NOW,
        "valid_from": NOW,
        "valid_to": None,
        "status": "active",
        "superseded_by": None,
        "superseded_at": None,
        "version": 1,
        "effective_to": None,
    }
    doc = build_doc(row, None)
    cues = extract("ＯＤ20241102 order status 退款", VOCAB, NOW)
    assert set(cues.entities) <= set(doc["entities"]) | set(doc["subject_ids"])
    assert "order status" in doc["aliases"]
    assert set(cues.event_types) <= set(doc["event_type"])
    assert "embedding" not in doc


def test_embedding_text_spells_out_the_key_and_aliases():
    text = embedding_text("P1 的后端服务端口是 8080", "project.backend_port", ["端口", "backend port"])
    assert "project backend port" in text and "端口" in text and text.startswith("P1 的后端服务端口")


def test_multi_word_aliases_match_in_any_order_and_beat_their_parts():
    vocab = Vocabulary.build(
        key_aliases=[
            ("project.backend_port", ["backend port"]),
            ("project.frontend_port", ["frontend port"]),
            ("x.port", ["port"]),
        ]
    )
    assert extract("what port does the P1 backend use", vocab, NOW).keys == ("project.backend_port",)
    assert extract("the port used by the frontend", vocab, NOW).keys == ("project.frontend_port",)
    assert extract("which port", vocab, NOW).keys == ("x.port",)


def test_english_plurals_meet_their_singular_aliases_but_bm25_sees_the_words_as_written():
    vocab = Vocabulary.build(key_aliases=[("preference.seat", ["seat preference"]), ("profile.address", ["address"])])
    cues = extract("what seats does U7 prefer", vocab, NOW)
    assert cues.keys == ("preference.seat",)
    assert cues.text == "seats u7 prefer"  # stopwords (`what`, `does`) gone, words unchanged
    assert extract("home addresses", vocab, NOW).keys == ("profile.address",)
    assert units("Cities Series bus") == ["city", "sery", "bus"]  # the rule is light, and consistent on both sides

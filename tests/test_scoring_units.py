"""A hit's text units, kept per text: the same units as computed afresh, bounded, and long texts never kept."""

from __future__ import annotations

import pytest

from projections.search.cues import units
from projections.search.recall import scoring
from projections.search.recall.scoring import CACHED_TEXT_CHARS, TEXT_UNITS_CACHED, text_units

TEXTS = [
    "Caroline: I went to a LGBTQ support group yesterday",
    "项目 P1 的后端端口是 8080",
    "Ｐ１ backend-port answers\x00seats",
    "",
    "x" * (CACHED_TEXT_CHARS + 1),
    "word " * 2000,
]


@pytest.mark.parametrize("text", TEXTS)
def test_the_units_are_the_texts_units_cached_or_not(text: str) -> None:
    assert text_units(text) == frozenset(units(text))
    assert text_units(text) == frozenset(units(text))  # the second call, from the cache for a short text


def test_a_long_text_is_never_kept() -> None:
    scoring._kept_units.cache_clear()
    text_units("long " * CACHED_TEXT_CHARS)
    assert scoring._kept_units.cache_info().currsize == 0
    text_units("short")
    assert scoring._kept_units.cache_info().currsize == 1


def test_the_cache_holds_at_most_its_bound() -> None:
    for i in range(TEXT_UNITS_CACHED + 500):
        text_units(f"turn {i}")
    assert scoring._kept_units.cache_info().currsize == TEXT_UNITS_CACHED


def test_a_hit_names_only_the_entity_cues_that_are_its_own_ids() -> None:
    """The class: ids whose words are the same (`alice.smith7`, `Alice-Smith7`) are different ids. A hit's
    explanation named every cue id reading as one of its ids, so each of two such subjects' facts claimed a match
    on the other's id. A hit names the cue ids it has (as the exact stage matches them); a question in words,
    which names both, gives each hit its own."""
    from datetime import UTC, datetime

    from projections.search.cues import Vocabulary, extract

    subjects = ["user:alice.smith7", "user:Alice-Smith7"]
    vocab = Vocabulary.build(subjects=subjects)
    now = datetime(2026, 11, 25, tzinfo=UTC)
    rows = {
        s: {"subject": s, "entities": [], "content": "phone", "aliases": [], "key": "phone", "scope": ""}
        for s in subjects
    }
    for question, wanted in (
        ("phone of user:alice.smith7?", {"user:alice.smith7": ["user:alice.smith7"], "user:Alice-Smith7": []}),
        ("phone of alice.smith7?", {"user:alice.smith7": ["alice.smith7"], "user:Alice-Smith7": []}),
        ("phone of alice smith7?", {"user:alice.smith7": ["alice.smith7"], "user:Alice-Smith7": ["alice-smith7"]}),
    ):
        cues = extract(question, vocab, now)
        for subject, row in rows.items():
            found, _ = scoring.matched(row, cues)
            assert found.get("entities", []) == wanted[subject], (question, subject, found)

"""Scoring a verified hit: its tier's band, its strength in the tier, the prior; and which cues it carries.

score = floor + 0.9 * strength + 0.09 * prior, with strength and prior in [0, 1]: a hit scores in
[floor, floor + 0.99], so a tier with a higher floor always ranks above one with a lower floor. The exact tier's
floor is 1 and its strength is how much of the question a hit covers (`overlap`); the fuzzy tier's floor is 0 and
its strength is the fused rank. Ties break on (score desc, valid_from desc, memory_id asc).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from projections.search.cues import Cues, canonical, event_types_in, key_phrases, subject_ids, units
from projections.search.recall.model import Match

__all__ = ["BAND", "Scored", "Strength", "by_fused_rank", "by_overlap", "matched", "prior", "score", "scored"]

BAND = 1.0  # the width of a band: tiers' floors differ by at least this much
Strength = Callable[[Match, float], float]  # (the match, its overlap) -> its strength in its tier, in [0, 1]


def by_overlap(match: Match, overlap: float) -> float:
    """Definite answers rank by how much of the question they cover."""
    return overlap


def by_fused_rank(match: Match, overlap: float) -> float:
    """Fuzzy answers rank by the fused rank of their stages' lists."""
    return match.fused


def prior(row: dict[str, Any], at: datetime) -> float:
    """Recency (30-day half-life from valid_from), importance, confidence: each in [0, 1]."""
    age_days = max(0.0, (at - row["valid_from"]).total_seconds() / 86400)
    recency = math.pow(0.5, age_days / 30)
    return 0.4 * recency + 0.3 * float(row["importance"]) + 0.3 * float(row["confidence"])


def matched(row: dict[str, Any], cues: Cues) -> tuple[dict[str, Any], float]:
    """Which cues this row carries, and how much of the query's content it covers (0..1)."""
    ids = {canonical(e) for e in row["entities"] or []} | {canonical(s) for s in subject_ids(row["subject"])}
    text_units = set(units(" ".join([row["content"] or "", *(row["aliases"] or []), *key_phrases(row["key"])])))
    counts = cues.unit_counts  # a long query repeats units: count each distinct one once per hit
    overlap = sum(n for u, n in counts.items() if u in text_units) / len(cues.content_units) if counts else 0.0
    found = {
        "entities": [e for e in cues.known_entities if canonical(e) in ids],
        "keys": [row["key"]] if row["key"] in cues.keys else [],
        "event_types": sorted(set(cues.event_types) & set(event_types_in(row["content"] or ""))),
    }
    if cues.time is not None:
        found["time"] = cues.time.words
    return {k: v for k, v in found.items() if v}, overlap


def score(floor: float, strength: float, prior: float) -> float:
    """A hit's score in its band (see the module docstring)."""
    return floor + 0.9 * min(strength, 1.0) + 0.09 * prior


@dataclass(slots=True)
class Scored:
    """A verified hit: the row that holds (PostgreSQL), the match that led to it, and its score."""

    row: dict[str, Any]
    match: Match
    score: float  # rounded to 6 places: the order and the response use the same number
    prior: float
    overlap: float
    cues: dict[str, Any]  # the cues it carries
    order: tuple[float, float, str]  # the sort key: score desc, valid_from desc, memory_id asc


def scored(row: dict[str, Any], m: Match, cues: Cues, at: datetime, floor: float, strength: Strength) -> Scored:
    p = prior(row, at)
    found, overlap = matched(row, cues)
    s = round(score(floor, strength(m, overlap), p), 6)
    return Scored(row, m, s, p, overlap, found, (-s, -row["valid_from"].timestamp(), row["memory_id"]))

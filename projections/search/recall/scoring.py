"""Scoring a verified hit: its tier's band, its strength in the tier, the prior; and which cues it carries.

score = floor + 0.9 * strength + 0.09 * prior stays within [floor, floor + 0.999], so a tier with a higher floor
(exact: 1) always ranks above a lower one (fuzzy: 0), however often a hit was served. The access signal's weight in
the prior is 0 by default, as every weight tried cost MRR on the dev set (bench/results/access-*.md): it only breaks
ties, and a fact never served has a signal of 0. Deterministic for a given state: ages are taken at `at`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from projections.search.cues import Cues, event_types_in, key_phrases, normalize_entity, subject_ids, units
from projections.search.recall.model import Match
from projections.search.recall.prefer import SUBJECT_FACTOR, TIME_FACTOR, subject_preference, time_preference

__all__ = [
    "MAX_ACCESS_WEIGHT",
    "BAND",
    "Scored",
    "Strength",
    "access_signal",
    "by_fused_rank",
    "by_overlap",
    "matched",
    "prior",
    "score",
    "scored",
    "text_units",
]

BAND = 1.0  # the width of a band: tiers' floors differ by at least this much
MAX_ACCESS_WEIGHT = 0.1  # the largest share of the prior the access signal may have (the other three sum to 1)
ACCESS_SATURATION = 100  # accesses at which the frequency half of the signal is full (log scale below)
ACCESS_HALF_LIFE_DAYS = 7.0  # recency of the last access
assert 0.9 + 0.09 * (1 + MAX_ACCESS_WEIGHT) < BAND  # the strongest fuzzy hit stays below the weakest exact one

# Texts whose units a process keeps: a version's text never changes, and successive recalls over one tenant verify
# many of the same versions, whose units would otherwise be read again on every call. Short texts only (a short
# turn's entry is a few KB), so the cache stays a few MB and a long text cannot fill it.
TEXT_UNITS_CACHED, CACHED_TEXT_CHARS = 2048, 1000


def text_units(text: str) -> frozenset[str]:
    """The distinct units of a hit's text (content, aliases and key phrases)."""
    return _kept_units(text) if len(text) <= CACHED_TEXT_CHARS else frozenset(units(text))


@lru_cache(maxsize=TEXT_UNITS_CACHED)
def _kept_units(text: str) -> frozenset[str]:
    return frozenset(units(text))


Strength = Callable[[Match, float], float]  # (the match, its overlap) -> its strength in its tier, in [0, 1]


def by_overlap(match: Match, overlap: float) -> float:
    """Definite answers rank by how much of the question they cover."""
    return overlap


def by_fused_rank(match: Match, overlap: float) -> float:
    """Fuzzy answers rank by the fused rank of their stages' lists."""
    return match.fused


def access_signal(row: dict[str, Any], at: datetime) -> float:
    """How often and how lately the fact was served, in [0, 1]; 0 for a fact never served (or without the columns)."""
    n = row.get("accesses") or 0
    if n <= 0:
        return 0.0
    frequency = min(1.0, math.log1p(n) / math.log1p(ACCESS_SATURATION))
    age_days = max(0.0, (at - row["last_accessed_at"]).total_seconds() / 86400)
    return 0.5 * frequency + 0.5 * math.pow(0.5, age_days / ACCESS_HALF_LIFE_DAYS)


def prior(row: dict[str, Any], at: datetime, access: float = 0.0, weight: float = 0.0) -> float:
    """Recency (30-day half-life from valid_from), importance, confidence, each in [0, 1], weighted to [0, 1]; plus
    `weight` (at most MAX_ACCESS_WEIGHT) * `access` (the access signal)."""
    age_days = max(0.0, (at - row["valid_from"]).total_seconds() / 86400)
    recency = math.pow(0.5, age_days / 30)
    base = 0.4 * recency + 0.3 * float(row["importance"]) + 0.3 * float(row["confidence"])
    return base + min(weight, MAX_ACCESS_WEIGHT) * access if access and weight > 0 else base


def matched(row: dict[str, Any], cues: Cues) -> tuple[dict[str, Any], float]:
    """Which cues this row carries, and how much of the query's content it covers (0..1)."""
    # the row's own ids, as the exact stage matches them: a cue naming `alice.smith` is not one of `Alice-Smith`'s,
    # although both read as the words `alice smith`
    ids = {normalize_entity(e) for e in row["entities"] or []} | set(subject_ids(row["subject"]))
    has = text_units(" ".join([row["content"] or "", *(row["aliases"] or []), *key_phrases(row["key"])]))
    counts = cues.unit_counts  # a long query repeats units: count each distinct one once per hit
    overlap = sum(n for u, n in counts.items() if u in has) / len(cues.content_units) if counts else 0.0
    found = {
        "entities": [e for e in cues.known_entities if e in ids],
        "keys": [row["key"]] if row["key"] in cues.keys else [],
        # read only when the query names an event type: the content's units again, for most queries in vain
        "event_types": sorted(set(cues.event_types) & set(event_types_in(row["content"] or "")))
        if cues.event_types
        else [],
    }
    if cues.time is not None:
        found["time"] = cues.time.words
    if row["scope"] and row["scope"] in cues.scopes:  # the scope the question names (recall.prefer)
        found["scope"] = row["scope"]
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
    order: tuple[float, float, float, str]  # the sort key: score desc, valid_from desc, access desc, memory_id asc
    access: float = 0.0  # the access signal (0: never served)
    preferred: tuple[str, ...] = ()  # why a preference moved it up (recall.prefer): "subject cue 'x'", "scope cue 'y'"
    factor: float = 1.0  # the preference's factor on its strength (recall.prefer.SUBJECT_FACTOR: not preferred)
    duplicates: tuple[str, ...] = ()  # the other episodes of its near-duplicate group (recall.groups)


def scored(
    row: dict[str, Any],
    m: Match,
    cues: Cues,
    at: datetime,
    floor: float,
    strength: Strength,
    access_weight: float = 0.0,
    subject_factor: float = SUBJECT_FACTOR,
    time_factor: float = TIME_FACTOR,
    served: Mapping[str, float] | None = None,
) -> Scored:
    # `served`: a replay's access signals, from its receipt (the ledger has no record of what was served)
    a = access_signal(row, at) if served is None else served.get(row["memory_id"], 0.0)
    p = prior(row, at, a, access_weight)
    found, overlap = matched(row, cues)
    factor, why = subject_preference(row, found.get("entities", ()), cues, subject_factor)
    on_date, dated = time_preference(row, cues, time_factor)
    factor, why = factor * on_date, why + dated
    s = round(score(floor, strength(m, overlap) * factor, p), 6)
    order = (-s, -row["valid_from"].timestamp(), -a, row["memory_id"])
    return Scored(row, m, s, p, overlap, found, order, a, why, factor)

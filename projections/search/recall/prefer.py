"""Preferences of recall: what a question names moves hits up without dropping the others.

Three pure rules, each a preference rather than a filter, so a hit the question does not name still ranks, lower:
subject (episodes about none of the named entities keep `subject_preference` of their strength), scope (within one
fact, the named scope's version, then the default scope's, trade places first) and date (episodes and events not
observed or valid on a named date or within `dates.TOLD_WITHIN_DAYS` after it, as things are told after they
happen, keep `time_preference`). None moves a hit out of its band. docs/INTERNALS.md, "Preferences".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from projections.search.cues import Cues
    from projections.search.recall.scoring import Scored

__all__ = [
    "DATED_KINDS",
    "OPEN_KINDS",
    "SUBJECT_FACTOR",
    "TIME_FACTOR",
    "prefer_scopes",
    "scope_rank",
    "subject_preference",
    "time_preference",
]

OPEN_KINDS = ("episodic",)  # kinds an entity cue prefers in the fuzzy stages instead of requiring
# The strength (fused rank) of an episode about none of the question's entities, relative to one about them: the
# default of Settings.subject_preference; a preference, not a filter, found more on the dev set (BENCHMARKS.md,
# "Dev set: the subject preference").
SUBJECT_FACTOR = 0.4
DATED_KINDS = ("episodic", "event")  # kinds that happened (or were said) at a time a calendar date can name
TIME_FACTOR = 0.6  # the strength an episode or event off every named date keeps (Settings.time_preference)


def subject_preference(
    row: dict[str, Any], carried: Sequence[str], cues: Cues, factor: float = SUBJECT_FACTOR
) -> tuple[float, tuple[str, ...]]:
    """(factor on the hit's strength, reasons for its explanation) for one hit; `carried`: the question's known
    entities the hit carries (scoring.matched); `factor`: the share an episode about none of them keeps."""
    if not cues.known_entities or row["kind"] not in OPEN_KINDS:
        return 1.0, ()
    if carried:
        return 1.0, tuple(f"subject cue '{e}'" for e in carried)
    return factor, ()


def time_preference(row: dict[str, Any], cues: Cues, factor: float = TIME_FACTOR) -> tuple[float, tuple[str, ...]]:
    """(factor on the hit's strength, reasons) for the calendar dates the question names (see the module docstring)."""
    if not cues.dates or row["kind"] not in DATED_KINDS:
        return 1.0, ()
    on = [d.words for d in cues.dates if d.matches(row["observed_at"]) or d.matches(row["valid_from"])]
    if on:
        return 1.0, tuple(f"date cue '{w}'" for w in on)
    return factor, ()


def scope_rank(scope: str, named: Sequence[str]) -> int:
    """Where a version of `scope` goes among its fact's versions: the named scopes in their order, the default, the
    rest."""
    if scope in named:
        return list(named).index(scope)
    return len(named) if scope == "" else len(named) + 1


def _reason(scope: str, named: Sequence[str]) -> str:
    return f"scope cue '{scope}'" if scope in named else "default scope"


def prefer_scopes(hits: list[Scored], named: Sequence[str], band: float) -> list[Scored]:
    """`hits` (in their final order) with each fact's versions across scopes reordered by `scope_rank`; `band`:
    the score at which the exact tier begins (a group never spans it)."""
    groups: dict[tuple[str, str, bool], list[int]] = {}
    for i, h in enumerate(hits):
        if h.row["key"] is not None:
            groups.setdefault((h.row["subject"], h.row["key"], h.score >= band), []).append(i)
    out = list(hits)
    for places in groups.values():
        if len(places) < 2 or len({hits[i].row["scope"] for i in places}) < 2:
            continue
        ranked = sorted(places, key=lambda i: (scope_rank(hits[i].row["scope"], named), i))
        first = hits[ranked[0]].row["scope"]
        for place, j in zip(places, ranked, strict=True):
            h, s = hits[j], hits[place].score
            why = h.preferred
            if j == ranked[0] and scope_rank(first, named) <= len(named):  # a named or the default scope leads
                why = (*why, _reason(first, named))
            out[place] = replace(h, score=s, order=(-s, *h.order[1:]), preferred=why)
    return out

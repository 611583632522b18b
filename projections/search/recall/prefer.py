"""Preferences of recall: what a question names moves hits up without dropping the others.

Three rules, all pure:

- Subject (speaker) preference, for episodes. A known entity in the question (a subject id such as `caroline` of
  `person:caroline`, or an entity the documents list) narrows the fuzzy stages to documents about it.
  For the kinds in OPEN_KINDS (episodes) another speaker's turn may hold the answer ("Melanie: you told me you
  went to the support group, Caroline"), so each fuzzy stage also asks a second search: those episodes about none
  of the named entities (model.Scope.others), listed after its own list and ranked apart in the fusion
  (fusion.rrf: they push no candidate of the first search down, so what the narrowed search found ranks as it
  did), and judged by the semantic cut-offs of an un-narrowed search. A hit from it has its strength in the tier
  multiplied by `Settings.subject_preference` (SUBJECT_FACTOR by default), and so does its rerank key
  (recall.rerank). The named subject's episodes carry the reason in their explanation (`match.preferred`:
  "subject cue 'caroline'"), the others the factor (`scores.preference`). A question that names nobody is
  not moved by it.
- Scope preference, for facts. A fact (subject, key) can hold a version in several scopes ('' the default, `test`,
  `prod`, ...), each its own memory. Among the hits of one fact, those of a scope the question names
  (cues.Cues.scopes: the tenant's scope names and their synonyms, "测试环境" -> `test`) come first, then the
  default scope's, then the rest, in their order before; they trade places and scores (as the rerank stage's hits
  do), so the score still orders the response and no other hit moves. A hit that lands first of its fact this
  way says why (`match.preferred`: "scope cue 'test'" or "default scope"). Only within one band: a fuzzy hit never
  takes an exact hit's place.
- Date preference, for episodes and events. A calendar date the question names (cues.Cues.dates: "in June", "on
  13 October 2023", "2023年5月"; projections.search.dates) prefers the episodes and events observed or valid on it
  or in the TOLD_WITHIN_DAYS days after it (a thing is told after it happened): the others keep
  `Settings.time_preference` (TIME_FACTOR) of their strength, like an episode of another speaker, and the ones
  on the date say so (`match.preferred`: "date cue 'in june'"). Facts (states, preferences) are never moved by it.
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

"""Fusing the lists of a tier's stages: the semantic acceptance cut-offs, then reciprocal rank fusion.

No single cosine cut-off separates related from unrelated questions (measured by `python -m
projections.search.calibrate`, numbers in its docstring), so a semantic hit is accepted when it scores
SEMANTIC_MIN alone, reaches SEMANTIC_DISTINCT and stands SEMANTIC_GAP above the mean of the next nine (unrelated
questions score flat), was narrowed by a deterministic cue (SEMANTIC_NARROWED), or BM25 also matched it
(SEMANTIC_SUPPORTED). The lists left then vote 1 / (RRF_K + rank), normalized so 1.0 is first in two lists; a hit
found by several stages is `hybrid`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from projections.search.recall.model import Candidate, Match

if TYPE_CHECKING:
    from projections.search.recall.stages import RecallContext, Stage

__all__ = ["RRF_K", "accept_semantic", "rrf", "semantic_passes"]

SEMANTIC_MIN = 0.63
SEMANTIC_DISTINCT = 0.55
SEMANTIC_GAP = 0.17
SEMANTIC_NARROWED = 0.55
SEMANTIC_SUPPORTED = 0.50
RRF_K = 5  # short lists (~10): a small k keeps rank 1 clearly above rank 2, above the prior's weight
RRF_NORM = 2 / (RRF_K + 1)  # the sum of being first in two lists


def semantic_passes(
    cos: float, ranked: list[float], *, keyword: bool = False, narrowed: bool = False, offset: float = 0.0
) -> bool:
    """Whether a semantic hit with cosine `cos` is an answer; `ranked`: the query's top cosines, best first.

    `offset`: the model's (ModelSpec.cosine_offset): the cut-offs above were measured on bge-small-zh."""
    cos, ranked = cos - offset, [r - offset for r in ranked]
    if cos >= SEMANTIC_MIN or (keyword and cos >= SEMANTIC_SUPPORTED) or (narrowed and cos >= SEMANTIC_NARROWED):
        return True
    rest = ranked[1:10]
    background = sum(rest) / len(rest) if rest else 1.0  # one candidate only: nothing to stand out from
    return cos >= SEMANTIC_DISTINCT and cos - background >= SEMANTIC_GAP


def accept_semantic(found: list[Candidate], support: set[str], ctx: RecallContext) -> list[Candidate]:
    """The semantic candidates that pass the cut-offs; `support`: version ids the tier's other stages found."""
    cues = ctx.cues
    known = bool(cues.known_entities)
    types = set(cues.event_types)
    models = ctx.semantic_models  # each hit is measured against its own model's list, with its offset
    ranked: dict[tuple[str, bool], list[float]] = {}  # per model, and apart for the second search
    for c in found:
        ranked.setdefault((models.get(c.version_id, ("", 0.0))[0], c.other), []).append(c.score or 0.0)
    out = []
    for c in found:
        typed = bool(types) and not types.isdisjoint(c.event_types)  # of the asked type
        model, off = models.get(c.version_id, ("", 0.0))
        keyword = c.version_id in support
        narrowed = known and not c.other  # the second search's episodes are about none of the entities
        if semantic_passes(
            c.score or 0.0, ranked[(model, c.other)], keyword=keyword, narrowed=narrowed or typed, offset=off
        ):
            out.append(c)
    return out


def rrf(found: Sequence[tuple[Stage, list[Candidate]]], ctx: RecallContext) -> list[Match]:
    """Reciprocal rank fusion of the stages' lists (in tier order), each first cut by its stage's `accept`."""
    ids = [{c.version_id for c in cands} for _, cands in found]
    matches: dict[str, Match] = {}
    for i, (stage, cands) in enumerate(found):
        support: set[str] = set().union(*(ids[:i] + ids[i + 1 :])) if len(ids) > 1 else set()
        shown = stage.score_name  # how the list's own score is shown in the explanation (None: not shown)
        ranks = [0, 0]  # a stage's second search (Candidate.other) is ranked apart: it pushes none down
        for c in stage.accept(cands, support, ctx):
            ranks[c.other] += 1
            rank = ranks[c.other]
            m = matches.get(c.version_id)
            if m is None:
                m = matches[c.version_id] = Match(c.version_id, c.memory_id, stage.name)
            elif m.stage != stage.name:
                m.stage = "hybrid"
            if shown is not None and c.score is not None:
                m.scores[shown] = round(c.score, 4)
            m.scores["rrf"] = m.scores.get("rrf", 0.0) + 1 / (RRF_K + rank)
    for m in matches.values():
        m.scores["rrf"] = round(m.scores["rrf"] / RRF_NORM, 6)  # 1.0 = first in both lists
    return list(matches.values())


def single(found: Iterable[tuple[Stage, list[Candidate]]]) -> list[Match]:
    """An unfused tier: its one stage's candidates, in its order."""
    return [Match(c.version_id, c.memory_id, stage.name) for stage, cands in found for c in cands]

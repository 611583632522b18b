"""Recall, deterministic first: cues -> exact -> keyword + semantic (fused) -> verify in PostgreSQL -> score -> rerank.

The package, by job:
- `engine`: `RecallEngine` (what `POST /v1/recall` calls) and the mode table `MODE_TIERS` (which stages each
  mode runs, in which tiers); orchestration only.
- `stages`: the stages (exact, keyword, semantic), each `ask(ctx)` + `run(ctx, ask) -> list[Candidate]`.
- `index`: the search-index port `SearchIndex` and `ElasticIndex`, its Elasticsearch implementation (the DSL).
- `fusion`: the semantic acceptance cut-offs (with their calibration) and reciprocal rank fusion.
- `verify`: every candidate re-read in PostgreSQL; only the version that holds at `as_of` counts.
- `scoring`: prior, coverage of the question, score bands (a fuzzy hit never ranks above an exact one).
- `response`: a hit as the API returns it. `trace`: `timed(stage)`, the per-stage times. `model`: the typed values
  stages pass each other, `Mode` and the request. `workers`: the threads CPU-heavy work runs in.
- `current`: the exact stage's question about entity ids, asked of PostgreSQL's current state (not the index).
- `rerank`: the cross-encoder reorders the first fuzzy hits. `prefer`: what a question names moves hits up.
- `groups`: one hit per group of near-duplicate episodes. `neighbours`: an episode hit's neighbouring turns.
- `access`: the order of candidates scored alike (access tracking). `metrics`: each stage's latency.

A new stage: a `Stage` subclass in stages.py, added to a tier in engine.MODE_TIERS. A new search backend: a class
implementing index.SearchIndex, passed as `RecallEngine(..., index=...)`.
"""

from projections.search.recall.engine import MODE_TIERS, RecallEngine, Tier
from projections.search.recall.fusion import semantic_passes
from projections.search.recall.index import ElasticIndex, SearchIndex
from projections.search.recall.model import MODES, Candidate, Match, Mode, RecallFilters, RecallQuery, Scope

__all__ = [
    "MODES",
    "MODE_TIERS",
    "Candidate",
    "ElasticIndex",
    "Match",
    "Mode",
    "RecallEngine",
    "RecallFilters",
    "RecallQuery",
    "Scope",
    "SearchIndex",
    "Tier",
    "semantic_passes",
]

"""Recall, deterministic first: cues -> exact -> keyword + semantic (fused) -> verify in PostgreSQL -> score -> rerank.

Modules: `engine` (RecallEngine, MODE_TIERS), `stages`, `index` (the search-index port), `current` (exact asks of
PostgreSQL), `fusion`, `verify`, `scoring`, `access`, `prefer`, `rerank`, `groups`, `neighbours`, `response`,
`model`, `trace`, `metrics`, `workers`. A new stage: a `Stage` subclass added to a tier of MODE_TIERS; a new
backend: an `index.SearchIndex` passed as `RecallEngine(..., index=...)`.
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

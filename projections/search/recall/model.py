"""The typed values of one recall: what is asked (`RecallQuery`, `Mode`), what a search may return (`Scope`),
what a stage finds (`Candidate`) and how its tier ranks it (`Match`).

Stages hand each other these, never strings or shared dicts; the index port (`index.SearchIndex`) speaks them too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from projections.search.cues import TimeRange
from projections.search.modes import MODES, Mode

__all__ = ["MODES", "Candidate", "Match", "Mode", "RecallFilters", "RecallQuery", "Scope"]

# Mode, MODES: defined once in projections.search.modes (a leaf, so api.schemas names them without the engine)


@dataclass(frozen=True)
class RecallFilters:
    """The caller's filters: each field any of its values (empty: no filter)."""

    kind: tuple[str, ...] = ()
    key: tuple[str, ...] = ()
    scope: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    source_type: tuple[str, ...] = ()

    def items(self) -> list[tuple[str, tuple[str, ...]]]:
        """(field, values) of the filters that are set."""
        return [(n, v) for n in ("kind", "key", "scope", "tags", "source_type") if (v := getattr(self, n))]

    def accepts(self, row: dict[str, Any]) -> bool:
        """Whether a fact_versions row passes (verification applies them again to what PostgreSQL holds)."""
        for name, vals in self.items():
            if name == "tags":
                if not set(vals) & set(row["tags"] or []):
                    return False
            elif name == "source_type":
                if (row["source"] or {}).get("type") not in vals:
                    return False
            elif row[name] not in vals:
                return False
        return True


@dataclass(frozen=True)
class RecallQuery:
    tenant: str
    query: str
    subject: str | None = None
    top_k: int = 5
    as_of: datetime | None = None
    mode: Mode = "auto"
    filters: RecallFilters = field(default_factory=RecallFilters)
    explain: bool = False  # the trace lists each stage's candidates (the console's playground), not only counts
    rerank: bool | None = None  # the cross-encoder over the fuzzy hits (recall.rerank); None: as the settings say
    context_turns: int = 0  # each episode hit's neighbouring turns, this many on each side (recall.neighbours)
    # transaction time: the answer as the ledger knew it then (candidates, verification, groups, context turns; the
    # hits are re-folded as known then by the caller, api.reads); None: as it knows now
    known_at: datetime | None = None
    # with known_at, a receipt's positions (partition -> next offset): verification knows only the versions logged
    # below them, so a version logged since with an earlier observed_at does not stand for the one the receipt cites
    below: Mapping[int, int] | None = None
    # with known_at, a receipt's access signals (memory_id -> signal) that ordered its answer's ties: how often the
    # facts were served is not in the ledger, so a replay takes them from the receipt and orders the ties the same
    served: Mapping[str, float] | None = None


class Scope(NamedTuple):
    """Which documents one search may return.

    Always: the tenant's versions that hold at `at` (valid time; as known at `known_at`: those logged by then, and
    below `below`, that began by `at` and were not known to have ended by then, index._in_force), the subject if
    given, the caller's filters,
    and, when the query has a time cue, only those events and episodes that happened (or were told) in it.
    Then at most one narrowing: about one of `entities` (entity ids or subject ids), or, failing those, at least
    one of `mentions` in the text (id-shaped tokens nobody knows). `open_kinds`: kinds the entity narrowing prefers
    rather than requires (recall.prefer: episodes of other speakers stay candidates): a fuzzy stage also
    searches `outside()`, the documents of those kinds about none of `entities`.

    A NamedTuple, like the other values built on every request: immutable and cheap to build (the exact path).
    """

    tenant: str
    at: datetime
    subject: str | None = None
    filters: RecallFilters = RecallFilters()
    time: TimeRange | None = None
    entities: tuple[str, ...] = ()
    mentions: tuple[str, ...] = ()
    open_kinds: tuple[str, ...] = ()
    outside: bool = False  # the reverse narrowing: documents of `open_kinds` about none of `entities`
    # transaction time: the versions logged by then that began by `at` and were not known then to have ended by
    # then (index._in_force); the rest, however they ended since
    known_at: datetime | None = None
    # with known_at, a receipt's positions (partition -> next offset): only versions (and successors) logged below
    # them are known
    below: Mapping[int, int] | None = None

    def about(
        self, entities: tuple[str, ...] = (), mentions: tuple[str, ...] = (), open_kinds: tuple[str, ...] = ()
    ) -> Scope:
        """This scope narrowed to documents about `entities` (or mentioning `mentions`)."""
        return self._replace(entities=entities, mentions=mentions, open_kinds=open_kinds, outside=False)

    def others(self) -> Scope:
        """The documents of `open_kinds` about none of this scope's entities (the second search)."""
        return self._replace(outside=True)


class Candidate(NamedTuple):
    """One document a stage found: a version that may answer (verification decides)."""

    version_id: str
    memory_id: str
    score: float | None = None  # the stage's own measure: BM25 (keyword), cosine (semantic); None (exact)
    event_types: tuple[str, ...] = ()  # of the document (the semantic acceptance asks for them)
    other: bool = False  # found by the second search (Scope.others): about none of the question's entities


@dataclass(slots=True)
class Match:
    """A candidate as its tier ranks it: which stage(s) found it and their scores (the hit's explanation)."""

    version_id: str
    memory_id: str
    stage: str  # exact | keyword | semantic | hybrid (found by more than one stage of its tier)
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def fused(self) -> float:
        """The fused rank (1.0 = first in both keyword and semantic lists); 0 outside a fused tier."""
        return self.scores.get("rrf", 0.0)

"""The stages of recall: each one question to the search index, as a small unit with one interface.

A stage first says what it would ask (`ask(ctx)`, pure: None means the query gives it nothing to ask, and it does
not run), then asks it (`run(ctx, ask)` -> candidates, best first). The engine times each run as the stage's
name (`trace.timed`), and a fused tier cuts each list with the stage's `accept` before fusing (fusion.rrf).

A new stage: subclass `Stage` here, and put an instance in a tier of the mode table (engine.MODE_TIERS).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Generic, NamedTuple, TypeVar

from projections.embedding import Embedder
from projections.search.cues import Cues, subject_ids
from projections.search.recall.fusion import accept_semantic
from projections.search.recall.index import SearchIndex
from projections.search.recall.model import Candidate, RecallQuery, Scope
from projections.search.recall.trace import Trace
from projections.search.recall.workers import EMBED_EXECUTOR

__all__ = ["EXACT_MAX", "ExactStage", "KeywordStage", "RecallContext", "SemanticStage", "Stage"]

EXACT_MAX = 100

A = TypeVar("A")


@dataclass(slots=True)
class RecallContext:
    """What a stage may read: the request, its cues, the scope every search has, the index, the trace."""

    query: RecallQuery
    at: datetime  # the valid time asked about (as_of, else now)
    cues: Cues
    scope: Scope  # tenant, validity at `at`, subject, filters, the time cue
    index: SearchIndex
    trace: Trace
    embedder: Callable[[], Awaitable[Embedder]]

    @classmethod
    def of(
        cls,
        q: RecallQuery,
        at: datetime,
        cues: Cues,
        index: SearchIndex,
        trace: Trace,
        embedder: Callable[[], Awaitable[Embedder]],
    ) -> RecallContext:
        return cls(q, at, cues, Scope(q.tenant, at, q.subject, q.filters, cues.time), index, trace, embedder)

    def fuzzy_scope(self) -> Scope:
        """The scope of the keyword and semantic stages: a known entity of the query narrows it to that entity
        (answers about others are wrong answers); an id-shaped token nobody knows must at least be in the text."""
        cues = self.cues
        if cues.known_entities:
            return self.scope.about(entities=cues.known_entities)
        if cues.unknown_entities:
            return self.scope.about(mentions=cues.unknown_entities)
        return self.scope


class Stage(ABC, Generic[A]):
    name: ClassVar[str]  # its key in the trace (stages_ms) and its label on the hits it finds
    score_name: ClassVar[str | None] = None  # its own score's name in a hit's explanation (None: not shown)

    @abstractmethod
    def ask(self, ctx: RecallContext) -> A | None:
        """What this stage would ask the index for this query, or None (it does not run)."""

    @abstractmethod
    async def run(self, ctx: RecallContext, ask: A) -> list[Candidate]:
        """Ask it: the candidates, best first."""

    def accept(self, found: list[Candidate], support: set[str], ctx: RecallContext) -> list[Candidate]:
        """The candidates that may enter fusion (`support`: version ids the tier's other stages found)."""
        return found


# --- exact: the cues pin the answer down -----------------------------------------------------------------------


class ExactAsk(NamedTuple):
    scope: Scope
    keys: tuple[str, ...] = ()
    event_types: tuple[str, ...] = ()


class ExactStage(Stage[ExactAsk]):
    """Entity ids, keys reached through aliases, event types: filters only, newest first."""

    name = "exact"

    def ask(self, ctx: RecallContext) -> ExactAsk | None:
        cues, q = ctx.cues, ctx.query
        # ids the vocabulary knows; failing those, id-shaped tokens it does not know (yet): the vocabulary
        # is reloaded every few seconds, but a term filter on the indexed ids is exact and costs one query,
        # so a fact about a brand-new entity is found exactly as soon as it is indexed
        anchors = cues.known_entities or tuple(dict.fromkeys(x for e in cues.unknown_entities for x in subject_ids(e)))
        types = cues.event_types if anchors or q.subject or cues.keys else ()
        if cues.keys or types:
            return ExactAsk(ctx.scope.about(entities=anchors), cues.keys, types)
        if anchors and (not cues.terms or q.mode == "exact"):
            return ExactAsk(ctx.scope.about(entities=anchors))  # the query is just the id(s): all known about them
        if q.mode == "exact" and cues.event_types:
            return ExactAsk(ctx.scope, (), cues.event_types)
        return None  # the cues do not pin an answer down

    async def run(self, ctx: RecallContext, ask: ExactAsk) -> list[Candidate]:
        size = min(EXACT_MAX, max(4 * ctx.query.top_k, 20))
        return await ctx.index.exact(ask.scope, ask.keys, ask.event_types, size)


# --- keyword and semantic: the fuzzy tier ----------------------------------------------------------------------


def _fuzzy_size(q: RecallQuery) -> int:
    return max(q.top_k * 2, 10)


class TextAsk(NamedTuple):
    scope: Scope
    text: str


class KeywordStage(Stage[TextAsk]):
    """BM25 over content, aliases and the key's words (CJK as uni+bigrams), of the query's words sans stopwords."""

    name = "keyword"
    score_name = "bm25"

    def ask(self, ctx: RecallContext) -> TextAsk | None:
        return TextAsk(ctx.fuzzy_scope(), ctx.cues.text) if ctx.cues.text else None

    async def run(self, ctx: RecallContext, ask: TextAsk) -> list[Candidate]:
        return await ctx.index.keyword(ask.scope, ask.text, _fuzzy_size(ctx.query))


class SemanticStage(Stage[TextAsk]):
    """Nearest neighbours of the raw query's embedding, cut by the acceptance rules of fusion.accept_semantic."""

    name = "semantic"
    score_name = "cosine"

    def ask(self, ctx: RecallContext) -> TextAsk | None:
        return TextAsk(ctx.fuzzy_scope(), ctx.query.query) if ctx.query.query.strip() else None

    async def run(self, ctx: RecallContext, ask: TextAsk) -> list[Candidate]:
        with ctx.trace.timed("embed"):  # loads the model on first use; both off the event loop
            emb = await ctx.embedder()
            vec = await asyncio.get_running_loop().run_in_executor(EMBED_EXECUTOR, emb.embed_query, ask.text)
            ctx.trace.embedding_computed = True
        return await ctx.index.nearest(ask.scope, vec.tolist(), _fuzzy_size(ctx.query))

    def accept(self, found: list[Candidate], support: set[str], ctx: RecallContext) -> list[Candidate]:
        return accept_semantic(found, support, ctx)

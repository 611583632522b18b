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
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Generic, NamedTuple, TypeVar

from psycopg_pool import AsyncConnectionPool

from producers.settings import Settings
from projections.embedding import Embedder
from projections.languages import DEFAULT_FIELD, slot_field, slots, text_slot
from projections.search.cues import Cues, Vocabulary, subject_ids
from projections.search.recall.current import exact_current, exact_current_marked
from projections.search.recall.fusion import accept_semantic
from projections.search.recall.index import SearchIndex
from projections.search.recall.model import Candidate, RecallQuery, Scope
from projections.search.recall.prefer import OPEN_KINDS
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
    embedder: Callable[..., Awaitable[Embedder]]  # (model name or None: the default) -> its embedder
    settings: Settings | None = None  # the models per language; None: one model, the default
    # version id -> (the model that found it, its cut-off offset) (fusion.accept_semantic)
    semantic_models: dict[str, tuple[str, float]] = field(default_factory=dict)
    pool: AsyncConnectionPool | None = None  # PostgreSQL: the exact stage's asks about ids (recall.current)
    # the cues came from this cached vocabulary, not yet checked against vocab_log: the exact stage reads the
    # tenant's newest sequence with its rows into `vocab_newest`, and the engine checks it before anything uses
    # what the stage found
    vocab_unchecked: Vocabulary | None = None
    vocab_newest: int | None = None
    served: dict[str, float] = field(default_factory=dict)  # the access signals that ordered ties (recall.access)

    @classmethod
    def of(
        cls,
        q: RecallQuery,
        at: datetime,
        cues: Cues,
        index: SearchIndex,
        trace: Trace,
        embedder: Callable[..., Awaitable[Embedder]],
        settings: Settings | None = None,
        pool: AsyncConnectionPool | None = None,
    ) -> RecallContext:
        scope = Scope(q.tenant, at, q.subject, q.filters, cues.time, known_at=q.known_at, below=q.below)
        return cls(q, at, cues, scope, index, trace, embedder, settings, pool=pool)

    def fuzzy_scope(self) -> Scope:
        """The scope of the keyword and semantic stages: a known entity of the query narrows it to that entity
        (answers about others are wrong answers); for episodes (OPEN_KINDS) what was said about or by the entity may
        be another speaker's turn, so each fuzzy stage also searches those about none of them (`Scope.others`, a
        list of its own, ranked apart and preferred less: recall.prefer); an id-shaped token nobody knows must at
        least be in the text. A request's own `subject` is the scope already: an entity named in the question
        narrows no further, or the subject's memories that mention it without listing it would never be found."""
        cues = self.cues
        if cues.known_entities and self.query.subject is None:
            return self.scope.about(entities=cues.known_entities, open_kinds=OPEN_KINDS)
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
    """Entity ids, keys reached through aliases, event types: filters only, newest first.

    An ask about entity ids is answered from PostgreSQL's current state (recall.current, timed as `exact_postgres`):
    a new fact is found exactly as soon as PostgreSQL has it, not once an indexer has written its document, and
    the same ask there was measured faster than the index's (docs/INTERNALS.md, "Exact answers from PostgreSQL"). An
    ask without ids (keys or event types alone) goes to the index."""

    name = "exact"

    def ask(self, ctx: RecallContext) -> ExactAsk | None:
        cues, q = ctx.cues, ctx.query
        # ids the vocabulary knows; failing those, id-shaped tokens it does not know (yet): the vocabulary follows
        # what the indexer made searchable, so an unknown id may be a brand-new entity that only PostgreSQL has
        anchors = cues.known_entities or tuple(dict.fromkeys(x for e in cues.unknown_entities for x in subject_ids(e)))
        types = cues.event_types if anchors or q.subject or cues.keys else ()
        if cues.keys or types:
            return ExactAsk(ctx.scope.about(entities=anchors), cues.keys, types)
        if anchors and (not cues.terms or q.mode == "exact"):
            return ExactAsk(ctx.scope.about(entities=anchors))  # the query is just the id(s): all known about them
        if q.mode == "exact" and cues.event_types:
            return ExactAsk(ctx.scope, (), cues.event_types)
        return None  # the cues do not pin an answer down

    def asks_postgres(self, ctx: RecallContext) -> bool:
        """Whether this query's ask goes to PostgreSQL (ids), where it can read the vocabulary's sequence too."""
        ask = self.ask(ctx)
        return ask is not None and bool(ask.scope.entities) and ctx.pool is not None

    async def run(self, ctx: RecallContext, ask: ExactAsk) -> list[Candidate]:
        size = min(EXACT_MAX, max(4 * ctx.query.top_k, 20))
        if ask.scope.entities and ctx.pool is not None:
            with ctx.trace.timed("exact_postgres"):
                if ctx.vocab_unchecked is None:
                    return await exact_current(ctx.pool, ask.scope, ask.keys, ask.event_types, size)
                found, ctx.vocab_newest = await exact_current_marked(
                    ctx.pool, ask.scope, ask.keys, ask.event_types, size
                )
                return found
        return await ctx.index.exact(ask.scope, ask.keys, ask.event_types, size)


# --- keyword and semantic: the fuzzy tier ----------------------------------------------------------------------


def _fuzzy_size(ctx: RecallContext) -> int:
    """How many candidates a fuzzy stage lists: the pool (Settings.recall_pool, at least top_k), so the fused list
    the rerank stage reorders holds what either stage found before anything is cut (without settings: 2 * top_k)."""
    if ctx.settings is None:
        return max(ctx.query.top_k * 2, 10)
    return max(ctx.query.top_k, ctx.settings.recall_pool)


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
        size = _fuzzy_size(ctx)
        scopes = (ask.scope, ask.scope.others()) if ask.scope.open_kinds else (ask.scope,)
        # the episodes about none of the named entities after them (recall.prefer); both asked at once
        lists = await asyncio.gather(*(ctx.index.keyword(scope, ask.text, size) for scope in scopes))
        return [c for found in lists for c in found]


class SemanticStage(Stage[TextAsk]):
    """Nearest neighbours of the raw query's embedding, cut by the acceptance rules of fusion.accept_semantic.

    The query is embedded by the model of its language (projections.languages, with the model's query
    instruction) and searches only that model's vectors. With `embed_cross_language` (default) every document has
    a vector of the default (Chinese) model, English ones one of the English model too: a Chinese question
    searches the default model's vectors of all documents (as with one model); an English question searches the
    English vectors and, when the tenant has documents without one (Chinese memories), also the default model's
    vectors of those, the two lists merged by cosine less each model's cut-off offset (ModelSpec.cosine_offset,
    the cut-offs' scale), so the better match leads whichever model found it (interleaving by rank would put the
    English list's weak first neighbour above a close Chinese fact).
    The English model does not embed Chinese questions: measured, its cosines do not separate them
    (BENCHMARKS.md, "Embedding models per language").
    """

    name = "semantic"
    score_name = "cosine"

    def ask(self, ctx: RecallContext) -> TextAsk | None:
        return TextAsk(ctx.fuzzy_scope(), ctx.query.query) if ctx.query.query.strip() else None

    async def _passes(self, ctx: RecallContext, text: str) -> list[tuple[str | None, str, str | None]]:
        """(model name, vector field, leave out documents with a vector of) to search, the question's own first."""
        s = ctx.settings
        if s is None or len(slots(s)) == 1 or text_slot(text) == "default":
            return [(s.embed_model if s is not None else None, DEFAULT_FIELD, None)]
        zh, en = s.embed_model, s.embed_model_en
        out: list[tuple[str | None, str, str | None]] = [(en, slot_field(s, "en"), None)]
        # documents indexed before per-language models name no model and hold the default model's vector (legacy):
        # an English question reaches them through this pass until `ledger reindex` gives them their English vectors
        if s.embed_cross_language and await ctx.index.has_model(ctx.query.tenant, zh, without=en, legacy=True):
            out.append((zh, DEFAULT_FIELD, en))  # the memories in Chinese, by the Chinese model
        return out

    async def run(self, ctx: RecallContext, ask: TextAsk) -> list[Candidate]:
        size = _fuzzy_size(ctx)
        lists: list[tuple[list[Candidate], float]] = []
        others: list[tuple[list[Candidate], float]] = []  # Scope.others: about none of the named entities
        for model, vector_field, without in await self._passes(ctx, ask.text):
            with ctx.trace.timed("embed_cross" if lists else "embed"):  # loads the model on first use, off the loop
                emb = await ctx.embedder(model)
                vec = await asyncio.get_running_loop().run_in_executor(EMBED_EXECUTOR, emb.embed_query, ask.text)
                ctx.trace.embedding_computed = True
            ctx.trace.embedding_models.append(emb.name)
            offset = _offset(ctx, emb)
            scopes = (ask.scope, ask.scope.others()) if ask.scope.open_kinds else (ask.scope,)
            query = vec.tolist()
            each = await asyncio.gather(
                *(ctx.index.nearest(scope, query, size, vector_field, model, without) for scope in scopes)
            )  # both asked at once, taken in scope order
            for found, into in zip(each, (lists, others), strict=False):
                for c in found:
                    ctx.semantic_models.setdefault(c.version_id, (emb.name, offset))
                into.append((found, offset))
        out = merge_by_offset(lists, size) if len(lists) > 1 else lists[0][0]
        if others:
            out += merge_by_offset(others, size) if len(others) > 1 else others[0][0]
        return out

    def accept(self, found: list[Candidate], support: set[str], ctx: RecallContext) -> list[Candidate]:
        return accept_semantic(found, support, ctx)


def _offset(ctx: RecallContext, emb: Embedder) -> float:
    """The cut-off offset of the model's cosines: the model's measured one, or `semantic_offset_en` for the
    English model when set."""
    s = ctx.settings
    if s is not None and s.semantic_offset_en is not None and len(slots(s)) > 1 and emb.name == s.embed_model_en:
        return s.semantic_offset_en
    return emb.spec.cosine_offset


def merge_by_offset(lists: list[tuple[list[Candidate], float]], size: int) -> list[Candidate]:
    """The `size` best of several models' lists by cosine less the model's offset (ties: the earlier list);
    a version already taken is skipped. The candidates keep their own cosine (the explanation shows it)."""
    ranked = sorted(
        ((-((c.score or 0.0) - off), i, r, c) for i, (found, off) in enumerate(lists) for r, c in enumerate(found)),
        key=lambda t: t[:3],
    )
    out: list[Candidate] = []
    seen: set[str] = set()
    for *_, c in ranked:
        if c.version_id not in seen:
            seen.add(c.version_id)
            out.append(c)
    return out[:size]

"""The recall engine: cues -> the mode's tiers of stages -> fusion -> verification -> scoring -> hits.

Independent of FastAPI: `RecallEngine(settings, es, pool).recall(RecallQuery(...))` returns the body of
`POST /v1/recall`. Deterministic first: each tier is verified and scored in its own band, so no hit of a later
tier (fuzzy) ranks above one of an earlier tier (exact); which tiers a mode runs is the table MODE_TIERS.
"""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

from elasticsearch import AsyncElasticsearch
from psycopg_pool import AsyncConnectionPool

from producers.settings import Settings
from projections import shapes
from projections.embedding import Embedder, load_embedder
from projections.postgres.queries import below_json, below_sql
from projections.postgres.receipts import Basis
from projections.search.cues import Cues, Vocabulary, extract
from projections.search.recall.access import access_signals, order_ties, tied_memory_ids
from projections.search.recall.fusion import rrf, single
from projections.search.recall.groups import GROUP_SLACK, collapse
from projections.search.recall.index import ElasticIndex, SearchIndex
from projections.search.recall.metrics import observe_stage
from projections.search.recall.model import MODES, Candidate, Match, Mode, RecallQuery
from projections.search.recall.neighbours import how, neighbours
from projections.search.recall.prefer import prefer_scopes
from projections.search.recall.rerank import Reranker
from projections.search.recall.response import hit
from projections.search.recall.scoring import BAND, Scored, Strength, by_fused_rank, by_overlap, scored
from projections.search.recall.stages import ExactStage, KeywordStage, RecallContext, SemanticStage, Stage
from projections.search.recall.trace import Observer, Trace
from projections.search.recall.verify import verify
from projections.search.recall.workers import CUES_EXECUTOR, EMBED_EXECUTOR
from projections.search.vocab import CommitListener, VocabularyCache, built_vocabulary, vocabulary_rows

__all__ = ["MODE_TIERS", "RecallEngine", "Tier"]

# Queries longer than this have their cues extracted in a worker thread: extraction is linear in the query, so a long
# one costs milliseconds of CPU that must not stall the event loop; a short one stays inline, where a thread
# hand-off would cost the exact path more than the work itself.
INLINE_CUES_CHARS = 256


@dataclass(frozen=True)
class Tier:
    """Stages whose hits rank together: `floor` is the tier's band, `strength` its order inside the band.

    `fused`: the stages' lists are cut and fused by reciprocal rank (fusion.rrf), timed as `fusion`, and the
    tier reports its candidates even when no stage had anything to ask; otherwise the tier has one stage and runs
    only when that stage asks something. `fallback`: only when the tiers before it verified nothing.
    """

    name: str  # trace keys: `<name>_candidates`, `verify_<name>`
    stages: tuple[Stage[Any], ...]
    floor: float
    strength: Strength
    fused: bool = False
    fallback: bool = False
    candidates_key: str = field(init=False)
    verify_key: str = field(init=False)

    def __post_init__(self) -> None:
        if not self.fused and len(self.stages) != 1:
            raise ValueError(f"tier {self.name}: an unfused tier has exactly one stage")
        object.__setattr__(self, "candidates_key", f"{self.name}_candidates")
        object.__setattr__(self, "verify_key", f"verify_{self.name}")


EXACT, KEYWORD, SEMANTIC = ExactStage(), KeywordStage(), SemanticStage()


def _exact() -> Tier:
    return Tier("exact", (EXACT,), floor=BAND, strength=by_overlap)


def _fuzzy(*stages: Stage[Any], fallback: bool = False) -> Tier:
    return Tier("fuzzy", stages, floor=0.0, strength=by_fused_rank, fused=True, fallback=fallback)


MODE_TIERS: dict[Mode, tuple[Tier, ...]] = {
    "auto": (_exact(), _fuzzy(KEYWORD, SEMANTIC, fallback=True)),
    "exact": (_exact(),),
    "keyword": (_fuzzy(KEYWORD),),
    "semantic": (_fuzzy(SEMANTIC),),
    "hybrid": (_exact(), _fuzzy(KEYWORD, SEMANTIC)),
}


def _check_table(table: dict[Mode, tuple[Tier, ...]]) -> None:
    """Every mode has tiers, and in each mode a later tier's band lies wholly below an earlier one's."""
    assert set(table) == set(MODES), f"modes without tiers: {set(MODES) - set(table)}"
    for mode, tiers in table.items():
        for a, b in zip(tiers, tiers[1:], strict=False):
            assert a.floor - b.floor >= BAND, f"{mode}: tier {b.name} could rank above tier {a.name}"


_check_table(MODE_TIERS)


class RecallEngine:
    """One per process: holds the search index, the PG pool, the vocabulary cache and (lazily) the embedder."""

    def __init__(
        self,
        settings: Settings,
        es: AsyncElasticsearch,
        pool: AsyncConnectionPool,
        *,
        vocab: VocabularyCache | None = None,
        embedder: Embedder | None = None,
        index: SearchIndex | None = None,
        observe: Observer | None = observe_stage,
    ) -> None:
        self.settings, self.es, self.pool = settings, es, pool
        self.index: SearchIndex = (
            index
            if index is not None
            else ElasticIndex(es, settings.es_index, stem_min_match=settings.keyword_stem_min_match)
        )
        self.vocab = vocab or VocabularyCache()
        self.access_weight = settings.access_prior_weight  # the access signal's share of the prior (scoring)
        self.subject_factor = settings.subject_preference  # an episode about none of the named subjects (prefer)
        self.time_factor = settings.time_preference  # an episode or event off every named calendar date (prefer)
        self.observe = observe  # sees every timed stage (name, ms); default: the stage histogram (recall.metrics)
        self._embedder = embedder
        self._embedder_lock = asyncio.Lock()
        self.reranker = Reranker(settings)  # the cross-encoder over the first fuzzy hits (recall.rerank)
        self._by_model: dict[str, Embedder] = {}  # the other language's model, loaded on first use

    async def aclose(self) -> None:
        """Stop the erasure listener (its PostgreSQL connection); the ES client and the pool are the caller's."""
        await self.vocab.aclose()

    async def embedder(self, model: str | None = None) -> Embedder:
        """The embedder of `model` (default: embed_model, or the one handed in), loaded once off the event loop."""
        if model is not None and model != self.settings.embed_model:
            async with self._embedder_lock:
                if model not in self._by_model:
                    loop = asyncio.get_running_loop()
                    self._by_model[model] = await loop.run_in_executor(
                        EMBED_EXECUTOR, lambda: load_embedder(self.settings, model=model)
                    )
            return self._by_model[model]
        if self._embedder is None:
            async with self._embedder_lock:
                if self._embedder is None:  # CPU-bound load: keep the event loop free
                    loop = asyncio.get_running_loop()
                    self._embedder = await loop.run_in_executor(EMBED_EXECUTOR, load_embedder, self.settings)
                    # The process is in its steady state now (modules, clients, the model): move what lives to
                    # the permanent generation, so a full collection (stop-the-world, long enough to delay health
                    # answers with all of it in view) scans only what requests create.
                    gc.freeze()
        return self._embedder

    async def recall(self, q: RecallQuery, basis: Basis | None = None) -> shapes.RecallResponse:
        """The answer to `q`; `basis`: verification reads what its receipt is made of into it (api.receipts)."""
        trace = Trace(q.mode, self.observe)
        # the valid time asked about, which relative time words ("yesterday", "last week") are read from too: a
        # question as of a past time means that time's yesterday, and a receipt's replay reads the same days
        at = q.as_of or datetime.now(UTC)
        with trace.timed("cues"):
            ctx = await self._context(q, at, trace)
        cues = ctx.cues

        hits: list[Scored] = []
        for tier in MODE_TIERS[q.mode]:
            if tier.fallback and hits:
                continue
            matches = await self._run(tier, ctx)
            if ctx.vocab_unchecked is not None:  # found with unchecked cues: check them, and with new ones ask again
                checked = await self._checked(ctx)
                if checked is not ctx:
                    ctx, cues = checked, checked.cues
                    matches = await self._run(tier, ctx)
            if matches:
                with trace.timed(tier.verify_key):
                    seen = {h.row["memory_id"] for h in hits}
                    for row, m in await verify(self.pool, q, at, matches, basis):
                        if row["memory_id"] not in seen:
                            hits.append(
                                scored(
                                    row,
                                    m,
                                    cues,
                                    at,
                                    tier.floor,
                                    tier.strength,
                                    self.access_weight,
                                    self.subject_factor,
                                    self.time_factor,
                                    q.served if q.known_at is not None else None,
                                )
                            )

        if basis is not None:  # the access signals the answer was ordered by (the rerank's window too): a replay's
            basis.served = {**ctx.served, **{h.row["memory_id"]: h.access for h in hits if h.access}}
        with trace.timed("rerank"):
            hits.sort(key=attrgetter("order"))
            if self.reranker.wanted(q):  # fuzzy hits only, never above an exact one; timed `cross_encoder` apart
                hits = await self.reranker.rerank(q, hits, trace)
            hits = prefer_scopes(hits, cues.scopes, BAND)  # a fact's named (else default) scope first (recall.prefer)
        with trace.timed("groups"):  # one hit per group of near-duplicate episodes (recall.groups)
            hits = await collapse(self.pool, q.tenant, hits[: q.top_k + GROUP_SLACK], at, q.known_at, q.below)
            shown = [hit(h) for h in hits[: q.top_k]]
        if q.context_turns:  # asked: each episode hit's neighbouring turns (recall.neighbours)
            with trace.timed("context"):
                window, rows = self.settings.recall_context_window_s, [h.row for h in hits[: q.top_k]]
                near = await neighbours(self.pool, q.tenant, at, rows, q.context_turns, window, q.known_at, q.below)
            for h in shown:
                if h["version_id"] in near:
                    h["context"] = near[h["version_id"]]
                    h["match"]["context"] = how(window)
        if q.known_at is not None and trace.listed:
            await self._known_listed(trace, q)
        return {"hits": shown, "cues": cues.as_dict(), "trace": trace.as_dict(at)}

    async def _known_listed(self, trace: Trace, q: RecallQuery) -> None:
        """`explain` as known at `known_at`: only the candidates the ledger had logged by then (and below a
        receipt's positions, when given), ranked among them.

        The index holds what is known now; a version logged later is left out of the listing as of the hits."""
        assert trace.listed is not None
        vids = sorted({c["version_id"] for found in trace.listed.values() for c in found})
        below = f" AND {below_sql()}" if q.below is not None else ""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT version_id FROM fact_versions WHERE tenant = %(tenant)s AND version_id = ANY(%(vids)s) "
                "AND observed_at <= %(known_at)s" + below,
                {"tenant": q.tenant, "vids": vids, "known_at": q.known_at, "below": below_json(q.below)},
            )
            known = {r[0] for r in await cur.fetchall()}
        for stage, found in trace.listed.items():
            kept = [c for c in found if c["version_id"] in known]
            trace.listed[stage] = [{**c, "rank": i + 1} for i, c in enumerate(kept)]

    def commits(self) -> CommitListener:
        """The process's one listener of the schema's commits (erasures, the projection's and the indexers'
        progress), started on the running loop; idempotent."""
        return self.vocab.listen(self.settings.pg_dsn, self.settings.pg_schema)

    async def _context(self, q: RecallQuery, at: datetime, trace: Trace) -> RecallContext:
        """The stages' context, with the cues of a vocabulary that holds every version indexed before the call.

        When the first stage to run is the exact one asking PostgreSQL, the cached vocabulary is used as it is and
        that stage reads the tenant's newest vocab_log sequence with its rows (`vocab_unchecked`; `_checked` decides
        after it ran); otherwise the vocabulary is brought up to the log here, before any stage sees a cue."""
        self.commits()  # an erasure drops the cached vocabulary at once
        schema, tenant = self.settings.pg_schema, q.tenant
        if q.below is not None:  # a replay reads the question with the vocabulary of the receipt's positions
            async with self.pool.connection() as conn:
                found = await vocabulary_rows(conn, tenant, q.below)
            return self._of(q, at, trace, await self._cues(q, await built_vocabulary(*found), at))
        ctx = None
        if (cached := self.vocab.cached(schema, tenant)) is not None and MODE_TIERS[q.mode][0].stages == (EXACT,):
            ctx = self._of(q, at, trace, await self._cues(q, cached, at))
            if EXACT.asks_postgres(ctx):
                ctx.vocab_unchecked = cached
                return ctx
        vocab = await self.vocab.get(self.pool, schema, tenant)
        if ctx is not None and vocab is cached:
            return ctx
        return self._of(q, at, trace, await self._cues(q, vocab, at))

    async def _checked(self, ctx: RecallContext) -> RecallContext:
        """`ctx` if its cues' vocabulary was current when the exact stage read the sequence, else a context with the
        cues of the vocabulary brought up to the log (the caller asks again)."""
        q, newest, unchecked = ctx.query, ctx.vocab_newest, ctx.vocab_unchecked
        ctx.vocab_unchecked = ctx.vocab_newest = None
        vocab = await self.vocab.current(self.pool, self.settings.pg_schema, q.tenant, newest)
        if vocab is unchecked:
            return ctx
        return self._of(q, ctx.at, ctx.trace, await self._cues(q, vocab, ctx.at))

    def _of(self, q: RecallQuery, at: datetime, trace: Trace, cues: Cues) -> RecallContext:
        return RecallContext.of(q, at, cues, self.index, trace, self.embedder, settings=self.settings, pool=self.pool)

    async def _cues(self, q: RecallQuery, vocab: Vocabulary, at: datetime) -> Cues:
        """The question's cues, its relative time words read from the valid time `at`."""
        if len(q.query) > INLINE_CUES_CHARS:
            return await asyncio.get_running_loop().run_in_executor(CUES_EXECUTOR, extract, q.query, vocab, at)
        return extract(q.query, vocab, at)

    async def _run(self, tier: Tier, ctx: RecallContext) -> list[Match] | None:
        """The tier's stages, each timed by its name, and their lists fused; None: the tier did not run."""
        asked = [(stage, ask) for stage in tier.stages if (ask := stage.ask(ctx)) is not None]

        async def timed(stage: Stage[Any], ask: Any) -> list[Candidate]:
            with ctx.trace.timed(stage.name):
                return await stage.run(ctx, ask)

        # a tier's stages at once: each asks the index on its own (an ask is pure), their lists kept in tier order
        # (gather, not a TaskGroup: a store failure stays itself, the 503 naming it)
        lists = await asyncio.gather(*(timed(stage, ask) for stage, ask in asked))
        found: list[tuple[Stage[Any], list[Candidate]]] = list(zip((s for s, _ in asked), lists, strict=True))
        if ctx.query.explain:
            for stage, candidates in found:
                ctx.trace.list_candidates(stage.name, candidates)
        if tier.fused:
            with ctx.trace.timed("fusion"):
                # ties a stage cannot break go by access, then version id (recall.access); not by access as known
                # at an earlier time, when the accesses recorded since would decide (verify leaves them out then too)
                if tied := tied_memory_ids(found):
                    if ctx.query.known_at is None:
                        signals = await access_signals(self.pool, ctx.query.tenant, tied, ctx.at)
                    else:  # a replay's: the receipt's signals, the ones that ordered these ties then
                        served = ctx.query.served or {}
                        signals = {m: served[m] for m in tied if m in served}
                    ctx.served.update(signals)
                    found = order_ties(found, signals)
                matches = rrf(found, ctx)
        elif found:
            matches = single(found)
        else:
            return None
        ctx.trace.candidates[tier.candidates_key] = len(matches)
        return matches

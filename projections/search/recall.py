"""Recall, deterministic first (DESIGN §5): cues -> exact -> keyword + semantic -> rerank -> verify.

Independent of FastAPI: `RecallEngine(settings, es, pool).recall(RecallQuery(...))` returns the
response dict of `POST /v1/recall`. Every hit is rebuilt from its PostgreSQL row after
verification, so what the index says is only ever a *candidate*: a lagging index can
delay a new value, never resurrect an old one. No match gives an empty list.

Ordering: exact hits score in [1, 2), fuzzy hits in [0, 1), so a fuzzy hit never ranks
above an exact one; ties break on (score desc, valid_from desc, memory_id asc).
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from elasticsearch import AsyncElasticsearch, NotFoundError
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from producers.settings import Settings
from projections.embedding import Embedder, load_embedder
from projections.search.cues import Cues, canonical, event_types_in, extract, key_phrases, subject_ids, units
from projections.search.documents import EFFECTIVE_TO, rows_sql
from projections.search.vocab import VocabularyCache

__all__ = ["RecallEngine", "RecallFilters", "RecallQuery", "Mode", "semantic_passes"]

Mode = Literal["auto", "exact", "keyword", "semantic", "hybrid"]

# Semantic cut-offs on cosine similarity (bge-small-zh-v1.5, raw query, no instruction prefix), measured with
# `python -m projections.search.calibrate` (24 bilingual facts, 48 related, 40 unrelated questions; the numbers
# are in that module's docstring). Unrelated questions reach 0.625 at most, related ones have a median of 0.66 and
# 10% of them lie under 0.57: no single cut-off separates them. A semantic hit is therefore accepted when
#  - its cosine >= SEMANTIC_MIN on its own, or
#  - it is distinct: cosine >= SEMANTIC_DISTINCT and at least SEMANTIC_GAP above the mean of the next nine
#    (an unrelated question scores flat across the facts: gap <= 0.161 measured; a related one stands out), or
#  - a known entity of the question narrowed the search to its facts, or the hit is of the event type the question
#    names (both deterministic cues): >= SEMANTIC_NARROWED (measured for entities: the right
#    fact 0.49..0.87, 19 of 21 at >= 0.55; the best fact of an unanswerable question about the entity reaches 0.621:
#    2 of 7 slip through, the price of finding a Chinese question about an English fact, e.g. "Alice 早上喜欢喝什么"
#    -> "Alice prefers green tea in the morning" at 0.552), or
#  - BM25 also matched it (lexical support): >= SEMANTIC_SUPPORTED.
SEMANTIC_MIN = 0.63
SEMANTIC_DISTINCT = 0.55
SEMANTIC_GAP = 0.17
SEMANTIC_NARROWED = 0.55
SEMANTIC_SUPPORTED = 0.50
KEYWORD_MIN_MATCH = "3<60%"  # of the query's analysed tokens (uni+bigrams, no stopwords): all of 1-3, else 60%
RRF_K = 5  # short lists (~10): a small k keeps rank 1 clearly above rank 2, above the prior's weight
EXACT_MAX = 100
# Queries longer than this have their cues extracted in a worker thread: extraction is linear (~5 us a unit), so a
# 2,000-character query costs up to ~10 ms of CPU that must not stall the event loop; a short one (~0.1 ms) stays
# inline, where a thread hand-off would cost the exact path more than the work itself.
INLINE_CUES_CHARS = 256
BACKGROUND_NICE = 10  # CPU-heavy recall work yields the CPU to the event loop and to cheap requests (health, exact)


def _lower_priority() -> None:
    """Run this worker thread (and the threads it creates, e.g. onnxruntime's pool) at a lower CPU priority.

    Linux nice values are per thread: on a busy machine the loop thread, the health probes and the exact path get
    the CPU first, and a flood of long semantic queries slows down semantic queries instead of the whole API.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at the normal priority
        pass


# ONE cue worker: extraction is pure Python and holds the GIL, and every extra thread contending for it delays the
# loop once more (12 concurrent hostile queries: loop lag 164 ms with the default executor, ~40 ms with one worker).
# Embeddings release the GIL (onnxruntime): two workers let a short query pass a long one; the model is loaded by
# one of them, so onnxruntime's own threads inherit the lower priority.
_CUES_EXECUTOR = ThreadPoolExecutor(1, thread_name_prefix="recall-cues")
_EMBED_EXECUTOR = ThreadPoolExecutor(2, thread_name_prefix="recall-embed", initializer=_lower_priority)


def semantic_passes(cos: float, ranked: list[float], *, keyword: bool = False, narrowed: bool = False) -> bool:
    """Whether a semantic hit with cosine `cos` is an answer; `ranked`: the query's top cosines, best first."""
    if cos >= SEMANTIC_MIN or (keyword and cos >= SEMANTIC_SUPPORTED) or (narrowed and cos >= SEMANTIC_NARROWED):
        return True
    rest = ranked[1:10]
    background = sum(rest) / len(rest) if rest else 1.0  # one candidate only: nothing to stand out from
    return cos >= SEMANTIC_DISTINCT and cos - background >= SEMANTIC_GAP


@dataclass(frozen=True)
class RecallFilters:
    kind: tuple[str, ...] = ()
    key: tuple[str, ...] = ()
    scope: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    source_type: tuple[str, ...] = ()

    def es_clauses(self) -> list[dict[str, Any]]:
        return [{"terms": {name: list(vals)}} for name, vals in self._items() if vals]

    def accepts(self, row: dict[str, Any]) -> bool:
        for name, vals in self._items():
            if not vals:
                continue
            if name == "tags":
                if not set(vals) & set(row["tags"] or []):
                    return False
            elif name == "source_type":
                if (row["source"] or {}).get("type") not in vals:
                    return False
            elif row[name] not in vals:
                return False
        return True

    def _items(self) -> list[tuple[str, tuple[str, ...]]]:
        return [(n, getattr(self, n)) for n in ("kind", "key", "scope", "tags", "source_type")]


@dataclass(frozen=True)
class RecallQuery:
    tenant: str
    query: str
    subject: str | None = None
    top_k: int = 5
    as_of: datetime | None = None
    mode: Mode = "auto"
    filters: RecallFilters = field(default_factory=RecallFilters)


@dataclass
class _Cand:
    version_id: str
    memory_id: str
    stage: str  # exact | keyword | semantic | hybrid (keyword and semantic)
    scores: dict[str, float] = field(default_factory=dict)


def _verify_sql(with_subject: bool) -> str:
    """The candidates' facts, each as the one version that holds at %(at)s (override first, then latest)."""
    where = sql.SQL(
        "f.tenant = %(tenant)s AND f.memory_id = ANY(%(mids)s) AND f.valid_from <= %(at)s"
        f" AND ({EFFECTIVE_TO} IS NULL OR {EFFECTIVE_TO} > %(at)s)"
        + (" AND f.subject = %(subject)s" if with_subject else "")
    )
    return (
        sql.SQL(
            "SELECT DISTINCT ON (memory_id) * FROM ({rows}) v ORDER BY memory_id, override DESC, "
            "valid_from DESC, observed_at DESC, version_id DESC"
        )
        .format(rows=rows_sql(where))
        .as_string()
    )


_VERIFY_SQL = {False: _verify_sql(False), True: _verify_sql(True)}  # rendered once: the exact path stays lean


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(UTC).isoformat().replace("+00:00", "Z")


class RecallEngine:
    """One per process: holds the ES client, the PG pool, the vocabulary cache and (lazily) the embedder."""

    def __init__(
        self,
        settings: Settings,
        es: AsyncElasticsearch,
        pool: AsyncConnectionPool,
        *,
        vocab: VocabularyCache | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.settings, self.es, self.pool = settings, es, pool
        self.vocab = vocab or VocabularyCache()
        self._embedder = embedder
        self._embedder_lock = asyncio.Lock()

    async def aclose(self) -> None:
        """Stop the erasure listener (its PostgreSQL connection); the ES client and the pool are the caller's."""
        await self.vocab.aclose()

    async def embedder(self) -> Embedder:
        if self._embedder is None:
            async with self._embedder_lock:
                if self._embedder is None:  # CPU-bound load: keep the event loop free
                    loop = asyncio.get_running_loop()
                    self._embedder = await loop.run_in_executor(_EMBED_EXECUTOR, load_embedder, self.settings)
                    # The process is in its steady state now (modules, clients, the model): move what lives to
                    # the permanent generation, so a full collection (stop-the-world, ~75 ms with all of it in
                    # view, seen as 100+ ms health answers) scans only what requests create.
                    gc.freeze()
        return self._embedder

    # --- the pipeline -------------------------------------------------------------------------------

    async def recall(self, q: RecallQuery) -> dict[str, Any]:
        t_start = time.perf_counter()
        stages: dict[str, float] = {}
        trace: dict[str, Any] = {"stages_ms": stages, "embedding_computed": False, "mode": q.mode}
        now = datetime.now(UTC)
        at = q.as_of or now

        t0 = time.perf_counter()
        self.vocab.listen(self.settings.pg_dsn)  # an erasure drops the cached vocabulary at once (idempotent)
        vocab = await self.vocab.get(self.pool, self.settings.pg_schema, q.tenant)
        if len(q.query) > INLINE_CUES_CHARS:
            cues = await asyncio.get_running_loop().run_in_executor(_CUES_EXECUTOR, extract, q.query, vocab, now)
        else:
            cues = extract(q.query, vocab, now)
        stages["cues"] = _ms(t0)

        base = self._base_filter(q, at)
        hits: list[dict[str, Any]] = []
        exact_clause = self._exact_clause(cues, q)
        if q.mode in ("auto", "exact", "hybrid") and exact_clause is not None:
            t0 = time.perf_counter()
            exact = await self._exact(base + exact_clause + self._time_filter(cues), q.top_k)
            stages["exact"] = _ms(t0)
            trace["exact_candidates"] = len(exact)
            if exact:
                t0 = time.perf_counter()
                hits = await self._verify(q, at, cues, exact)
                stages["verify_exact"] = _ms(t0)
        fuzzy_modes = {"keyword": ("keyword",), "semantic": ("semantic",), "hybrid": ("keyword", "semantic")}
        use = fuzzy_modes.get(q.mode, ("keyword", "semantic") if q.mode == "auto" and not hits else ())
        if use:
            fuzzy = await self._fuzzy(q, cues, base, use, stages, trace)
            trace["fuzzy_candidates"] = len(fuzzy)
            if fuzzy:
                t0 = time.perf_counter()
                seen = {h["memory_id"] for h in hits}
                hits += [h for h in await self._verify(q, at, cues, fuzzy) if h["memory_id"] not in seen]
                stages["verify_fuzzy"] = _ms(t0)

        if not hits:  # perhaps an alias or entity written after the vocabulary was loaded
            self.vocab.nudge(self.pool, self.settings.pg_schema, q.tenant)
        t0 = time.perf_counter()
        hits.sort(key=lambda h: (-h["score"], -h["_vf"], h["memory_id"]))
        for h in hits:
            del h["_vf"]
        stages["rerank"] = _ms(t0)
        trace["total_ms"] = _ms(t_start)
        trace["as_of"] = _iso(at)
        return {"hits": hits[: q.top_k], "cues": cues.as_dict(), "trace": trace}

    # --- filters ------------------------------------------------------------------------------------

    def _base_filter(self, q: RecallQuery, at: datetime) -> list[dict[str, Any]]:
        """Tenant (always), subject (when given), validity at `at`, the caller's filters."""
        t = at.isoformat()
        out: list[dict[str, Any]] = [
            {"term": {"tenant": q.tenant}},
            {"range": {"valid_from": {"lte": t}}},
            {
                "bool": {
                    "should": [
                        {"bool": {"must_not": {"exists": {"field": "valid_to"}}}},
                        {"range": {"valid_to": {"gt": t}}},
                    ]
                }
            },
        ]
        if q.subject:
            out.append({"term": {"subject": q.subject}})
        return out + q.filters.es_clauses()

    @staticmethod
    def _anchor(entities: Sequence[str]) -> dict[str, Any]:
        return {
            "bool": {
                "should": [{"terms": {"entities": list(entities)}}, {"terms": {"subject_ids": list(entities)}}],
                "minimum_should_match": 1,
            }
        }

    @staticmethod
    def _time_filter(cues: Cues) -> list[dict[str, Any]]:
        """A time cue narrows events and episodes to those that happened (or were told) in the range."""
        if cues.time is None:
            return []
        rng = {"gte": cues.time.start.isoformat(), "lt": cues.time.end.isoformat()}
        return [
            {
                "bool": {
                    "should": [
                        {"bool": {"must_not": {"terms": {"kind": ["event", "episodic"]}}}},
                        {"range": {"valid_from": rng}},
                        {"range": {"observed_at": rng}},
                    ],
                    "minimum_should_match": 1,
                }
            }
        ]

    def _exact_clause(self, cues: Cues, q: RecallQuery) -> list[dict[str, Any]] | None:
        """The filter of the exact stage, or None when the cues do not pin an answer down."""
        # ids the vocabulary knows; failing those, id-shaped tokens it does not know (yet): the vocabulary
        # is reloaded every few seconds, but a term filter on the indexed ids is exact and costs one query,
        # so a fact about a brand-new entity is found exactly as soon as it is indexed
        anchors = cues.known_entities or tuple(dict.fromkeys(x for e in cues.unknown_entities for x in subject_ids(e)))
        anchored = bool(anchors)
        attrs: list[dict[str, Any]] = []
        if cues.keys:
            attrs.append({"terms": {"key": list(cues.keys)}})
        if cues.event_types and (anchored or q.subject or cues.keys):
            attrs.append({"terms": {"event_type": list(cues.event_types)}})
        clause = [self._anchor(anchors)] if anchored else []
        if attrs:
            return clause + [{"bool": {"should": attrs, "minimum_should_match": 1}}]
        if anchored and (not cues.terms or q.mode == "exact"):
            return clause  # the query is just the id(s): everything known about them
        if q.mode == "exact" and cues.event_types:
            return [{"terms": {"event_type": list(cues.event_types)}}]
        return None

    def _fuzzy_filters(self, cues: Cues, base: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The filter of the keyword and semantic stages (its size is bounded by the cues' bounds)."""
        filters = base + self._time_filter(cues)
        if cues.known_entities:  # the query names this tenant's entity: answers about others are wrong answers
            filters.append(self._anchor(cues.known_entities))
        elif cues.unknown_entities:  # an id-shaped token nobody knows: it must at least be in the text
            filters.append(
                {
                    "bool": {
                        "should": [{"match": {"content": e}} for e in cues.unknown_entities]
                        + [{"match": {"aliases_text": e}} for e in cues.unknown_entities],
                        "minimum_should_match": 1,
                    }
                }
            )
        return filters

    # --- stages -------------------------------------------------------------------------------------

    async def _search(self, **body: Any) -> list[dict[str, Any]]:
        """Ids, memory ids (from doc values: no _source is read) and scores of the matching documents."""
        try:
            res = await self.es.search(
                index=self.settings.es_index,
                track_total_hits=False,
                source=False,
                docvalue_fields=["memory_id", "event_type"],
                filter_path=["hits.hits._id", "hits.hits._score", "hits.hits.fields"],
                **body,
            )
        except NotFoundError:  # nothing indexed yet
            return []
        return res.get("hits", {}).get("hits", [])

    async def _exact(self, filters: list[dict[str, Any]], top_k: int) -> list[_Cand]:
        hits = await self._search(
            query={"bool": {"filter": filters}},
            size=min(EXACT_MAX, max(4 * top_k, 20)),
            sort=[{"valid_from": "desc"}, {"version_id": "asc"}],
        )
        return [_Cand(h["_id"], h["fields"]["memory_id"][0], "exact") for h in hits]

    async def _fuzzy(
        self,
        q: RecallQuery,
        cues: Cues,
        base: list[dict[str, Any]],
        use: tuple[str, ...],
        stages: dict[str, float],
        trace: dict[str, Any],
    ) -> list[_Cand]:
        filters = self._fuzzy_filters(cues, base)
        narrowed = bool(cues.known_entities)
        size = max(q.top_k * 2, 10)
        kw: list[dict[str, Any]] = []
        sem: list[dict[str, Any]] = []
        if "keyword" in use and cues.text:
            t0 = time.perf_counter()
            kw = await self._search(
                query={
                    "bool": {
                        "filter": filters,
                        "must": {
                            "combined_fields": {
                                "query": cues.text,
                                "fields": ["content", "aliases_text^2", "key_text^1.5"],
                                "minimum_should_match": KEYWORD_MIN_MATCH,
                            }
                        },
                    }
                },
                size=size,
            )
            stages["keyword"] = _ms(t0)
        if "semantic" in use and q.query.strip():
            t0 = time.perf_counter()
            emb = await self.embedder()
            vec = await asyncio.get_running_loop().run_in_executor(_EMBED_EXECUTOR, emb.embed_query, q.query)
            trace["embedding_computed"] = True
            stages["embed"] = _ms(t0)
            t0 = time.perf_counter()
            sem = await self._search(
                knn={
                    "field": "embedding",
                    "query_vector": vec.tolist(),
                    "k": size,
                    "num_candidates": max(100, size * 10),
                    "filter": {"bool": {"filter": filters}},
                },
                size=size,
            )
            stages["semantic"] = _ms(t0)
        t0 = time.perf_counter()
        out = self._fuse(kw, sem, narrowed, set(cues.event_types))
        stages["fusion"] = _ms(t0)
        return out

    @staticmethod
    def _fuse(kw: list[dict[str, Any]], sem: list[dict[str, Any]], narrowed: bool, types: set[str]) -> list[_Cand]:
        """Reciprocal rank fusion of the keyword and the (cut-off) semantic list."""
        cands: dict[str, _Cand] = {}
        kw_ids = {h["_id"] for h in kw}
        for rank, h in enumerate(kw, 1):
            c = cands.setdefault(h["_id"], _Cand(h["_id"], h["fields"]["memory_id"][0], "keyword"))
            c.scores["bm25"] = round(h["_score"], 4)
            c.scores["rrf"] = c.scores.get("rrf", 0.0) + 1 / (RRF_K + rank)
        rank = 0
        ranked = [2 * h["_score"] - 1 for h in sem]  # ES reports (1 + cosine) / 2
        for h, cos in zip(sem, ranked, strict=True):
            typed = bool(types) and not types.isdisjoint(h["fields"].get("event_type", ()))  # of the asked type
            if not semantic_passes(cos, ranked, keyword=h["_id"] in kw_ids, narrowed=narrowed or typed):
                continue
            rank += 1
            c = cands.setdefault(h["_id"], _Cand(h["_id"], h["fields"]["memory_id"][0], "semantic"))
            if c.stage == "keyword":
                c.stage = "hybrid"
            c.scores["cosine"] = round(cos, 4)
            c.scores["rrf"] = c.scores.get("rrf", 0.0) + 1 / (RRF_K + rank)
        for c in cands.values():
            c.scores["rrf"] = round(c.scores["rrf"] / (2 / (RRF_K + 1)), 6)  # 1.0 = first in both lists
        return list(cands.values())

    # --- verification and scoring --------------------------------------------------------------------

    async def _verify(self, q: RecallQuery, at: datetime, cues: Cues, cands: list[_Cand]) -> list[dict[str, Any]]:
        """Re-read every candidate's fact in PostgreSQL: keep the version that holds at `at`, drop the rest."""
        by_memory: dict[str, _Cand] = {}
        for c in cands:  # several versions of one fact: the best-scored candidate speaks for it
            prev = by_memory.get(c.memory_id)
            if prev is None or c.scores.get("rrf", 0) > prev.scores.get("rrf", 0):
                by_memory[c.memory_id] = c
        query = _VERIFY_SQL[bool(q.subject)]
        params = {"tenant": q.tenant, "mids": sorted(by_memory), "at": at, "subject": q.subject}
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            rows = await cur.fetchall()
        hits = []
        for row in rows:
            if not q.filters.accepts(row):
                continue
            c = by_memory[row["memory_id"]]
            hits.append(self._hit(row, c, cues, at))
        return hits

    @staticmethod
    def _prior(row: dict[str, Any], at: datetime) -> float:
        """Recency (30-day half-life from valid_from), importance, confidence: each in [0, 1]."""
        age_days = max(0.0, (at - row["valid_from"]).total_seconds() / 86400)
        recency = math.pow(0.5, age_days / 30)
        return 0.4 * recency + 0.3 * float(row["importance"]) + 0.3 * float(row["confidence"])

    @staticmethod
    def _matched(row: dict[str, Any], cues: Cues) -> tuple[dict[str, Any], float]:
        """Which cues this row carries, and how much of the query's content it covers (0..1)."""
        ids = {canonical(e) for e in row["entities"] or []} | {canonical(s) for s in subject_ids(row["subject"])}
        text_units = set(units(" ".join([row["content"] or "", *(row["aliases"] or []), *key_phrases(row["key"])])))
        counts = cues.unit_counts  # a long query repeats units: count each distinct one once per hit
        overlap = sum(n for u, n in counts.items() if u in text_units) / len(cues.content_units) if counts else 0.0
        matched = {
            "entities": [e for e in cues.known_entities if canonical(e) in ids],
            "keys": [row["key"]] if row["key"] in cues.keys else [],
            "event_types": sorted(set(cues.event_types) & set(event_types_in(row["content"] or ""))),
        }
        if cues.time is not None:
            matched["time"] = cues.time.words
        return {k: v for k, v in matched.items() if v}, overlap

    def _hit(self, row: dict[str, Any], c: _Cand, cues: Cues, at: datetime) -> dict[str, Any]:
        prior = self._prior(row, at)
        matched, overlap = self._matched(row, cues)
        if c.stage == "exact":
            score = 1 + 0.9 * overlap + 0.09 * prior  # how much of the question it covers first, the prior second
        else:
            score = 0.9 * c.scores.get("rrf", 0.0) + 0.09 * prior  # the fused rank first, the prior second
        scores = {**c.scores, "prior": round(prior, 4), "overlap": round(overlap, 4)}
        match: dict[str, Any] = {"stage": c.stage, "cues": matched, "scores": scores}
        if row["version_id"] != c.version_id:
            match["verified"] = {"candidate": c.version_id, "replaced_by": row["version_id"]}
        else:
            match["verified"] = {"candidate": c.version_id}
        return {
            "memory_id": row["memory_id"],
            "version_id": row["version_id"],
            "event_id": row["event_id"],  # the producer's id of the assertion, beside the tenant-scoped version_id
            "version": row["version"],
            "subject": row["subject"],
            "key": row["key"],
            "scope": row["scope"],
            "value": row["value"],
            "content": row["content"],
            "kind": row["kind"],
            "status": row["status"],
            "valid_from": _iso(row["valid_from"]),
            "valid_to": _iso(row["effective_to"]),
            "observed_at": _iso(row["observed_at"]),
            "source": row["source"],
            "score": round(score, 6),
            "match": match,
            "_vf": row["valid_from"].timestamp(),
        }

"""The search-index port of recall: the few questions the stages ask (`SearchIndex`), and Elasticsearch's answers.

A stage says *what* it wants in the terms of `model.Scope` and `model.Candidate`; `ElasticIndex` turns that into
the query DSL of the index that `projections.search.mapping` defines and `projections.search.indexer` fills.
Another backend (OpenSearch, pgvector, an in-memory index for tests) implements `SearchIndex` and is handed to
`RecallEngine(..., index=...)`; nothing else in recall changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from elasticsearch import AsyncElasticsearch, NotFoundError

from projections.search.recall.model import Candidate, Scope
from projections.search.stemming import STEM_FIELD, query_stems

__all__ = ["ElasticIndex", "SearchIndex", "holds_at_filter"]


class SearchIndex(Protocol):
    """What recall asks an index. Every answer is only a candidate: verification re-reads PostgreSQL."""

    async def exact(self, scope: Scope, keys: Sequence[str], event_types: Sequence[str], size: int) -> list[Candidate]:
        """Documents in `scope` with one of `keys` or `event_types` (neither given: all of the scope), newest
        first (valid_from desc, then version_id)."""
        ...

    async def keyword(self, scope: Scope, text: str, size: int) -> list[Candidate]:
        """Documents in `scope` matching `text` lexically, best first; `score` is the lexical score (BM25)."""
        ...

    async def nearest(
        self,
        scope: Scope,
        vector: Sequence[float],
        size: int,
        field: str = "embedding",
        model: str | None = None,
        without: str | None = None,
    ) -> list[Candidate]:
        """The `size` documents in `scope` nearest to `vector`, nearest first; `score` is the cosine similarity,
        `event_types` the document's. `field` is the vector field to search, `model` keeps only vectors
        `model` made (None: any), `without` leaves out documents that also hold a vector of that model."""
        ...

    async def has_model(self, tenant: str, model: str, without: str | None = None, legacy: bool = False) -> bool:
        """Whether the tenant has a document with a vector of `model` (and none of `without`). `legacy`:
        a document that names no model (indexed before per-language models) counts as `model`'s."""
        ...


# The keyword stage asks two clauses, either may match, their BM25 scores add up:
#  - the words as written over content, aliases and the key (CJK as uni+bigrams): Chinese, and the exact phrasing;
#    of its analysed tokens all of 1-3 must match, else 60% (bigrams make it strict: a phrase-like clause)
#  - the English stems of the words over `content_stem` (projections.search.stemming; not for a query with Han
#    text), OR semantics with a minimum for long questions (Settings.keyword_stem_min_match, default below).
# Both clauses, stem minimum "1<25%": the best measured on the dev set short of dropping the first clause, which
# Chinese needs (BENCHMARKS.md, "Keyword stage: its clauses").
KEYWORD_MIN_MATCH = "3<60%"
KEYWORD_FIELDS = ["content", "aliases_text^2", "key_text^1.5"]
KEYWORD_STEM_MIN_MATCH = "1<25%"  # any one stem of up to 7; 2 of 8-11, 3 of 12-15, ...


def holds_at_filter(at: datetime) -> list[dict[str, Any]]:
    """The documents whose version holds at valid time `at`: valid_from <= at < valid_to (missing: open).

    A document's `valid_to` is the version's effective end, min(valid_to, superseded_at) (documents.status_fields),
    so this is the rule of projections.versions.holds_at, to the millisecond the index keeps (a version ending in
    the millisecond of `at` is a candidate too). Overrides are not preferred here: the index returns
    every version that holds, and verification keeps the one that wins (projections.postgres.queries.visible_sql).
    """
    t = at.isoformat()
    return [
        {"range": {"valid_from": {"lte": t}}},
        {
            "bool": {
                "should": [
                    {"bool": {"must_not": {"exists": {"field": "valid_to"}}}},
                    # `date` fields hold milliseconds (the stored end is cut to one): `gte` also takes a version
                    # ending later in the millisecond of `at`; verification then holds it to the microsecond
                    {"range": {"valid_to": {"gte": t}}},
                ]
            }
        },
    ]


def _ms(t: datetime) -> str:
    """`t` cut to the millisecond a `date` field holds: a stored time below it is below `t` itself."""
    return t.replace(microsecond=t.microsecond // 1000 * 1000).isoformat()


def _logged_below(below: Mapping[int, int], partition: str, offset: str) -> dict[str, Any]:
    """The documents whose `partition` and `offset` fields place a record below the positions `below` (a partition
    they do not name: none of it, as queries.below_sql)."""
    if not below:
        return {"match_none": {}}
    places = [
        {"bool": {"filter": [{"term": {partition: p}}, {"range": {offset: {"lt": o}}}]}} for p, o in below.items()
    ]
    return {"bool": {"should": places, "minimum_should_match": 1}}


def _in_force(scope: Scope) -> list[dict[str, Any]]:
    """The versions a scope may find: those that hold at `at`, or, as known at `known_at`, those logged by then
    (and below `below`, if given) that began by `at` (their end as the index holds it may come from a retraction or
    successor logged later, so verification decides, as known then: recall.verify), but for the versions whose
    successor, begun by `at`, was also known then (observed by `known_at`, and logged below `below`), those whose
    own event asserted an end before `at`, and those a retraction known then ended before `at` (one that ended it
    whatever else was known: documents.rows_sql): as known then, none of them held at `at`, so they could only
    crowd a stage's candidates. Each comparison with an end is strict at the millisecond the index keeps, so an
    end in the millisecond of `at` (or known in that of `known_at`) leaves its version a candidate. A document
    written before the index held these fields lacks them and stays a candidate (`ledger reindex` writes them)."""
    if scope.known_at is None:
        return holds_at_filter(scope.at)
    replaced: list[dict[str, Any]] = [
        {"range": {"superseded_at": {"lt": _ms(scope.at)}}},
        {"range": {"successor_observed_at": {"lt": _ms(scope.known_at)}}},
    ]
    retracted: list[dict[str, Any]] = [
        {"range": {"retracted_at": {"lt": _ms(scope.at)}}},
        {"range": {"retraction_observed_at": {"lt": _ms(scope.known_at)}}},
    ]
    known: list[dict[str, Any]] = [
        {"range": {"valid_from": {"lte": scope.at.isoformat()}}},
        {"range": {"observed_at": {"lte": scope.known_at.isoformat()}}},
        {"bool": {"must_not": {"range": {"asserted_valid_to": {"lt": _ms(scope.at)}}}}},  # ended by its own event
    ]
    if scope.below is not None:
        replaced.append(_logged_below(scope.below, "successor_partition", "successor_offset"))
        retracted.append(_logged_below(scope.below, "retraction_partition", "retraction_offset"))
        unplaced = {"bool": {"must_not": {"exists": {"field": "offset"}}}}
        logged = [_logged_below(scope.below, "partition", "offset"), unplaced]
        known.append({"bool": {"should": logged, "minimum_should_match": 1}})
    ended = [{"bool": {"filter": replaced}}, {"bool": {"filter": retracted}}]
    return [*known, {"bool": {"must_not": ended}}]


def _terms_any(fields: dict[str, Sequence[str]]) -> dict[str, Any]:
    return {"bool": {"should": [{"terms": {f: list(v)}} for f, v in fields.items()], "minimum_should_match": 1}}


class ElasticIndex:
    """`SearchIndex` over the Elasticsearch alias `index` (ids and memory ids from doc values: no _source read)."""

    def __init__(self, es: AsyncElasticsearch, index: str, *, stem_min_match: str = KEYWORD_STEM_MIN_MATCH) -> None:
        self.es, self.index, self.stem_min_match = es, index, stem_min_match

    # --- the DSL -------------------------------------------------------------------------------------

    @staticmethod
    def filters(scope: Scope) -> list[dict[str, Any]]:
        """The bool filter of a scope (its size is bounded by the cues' bounds)."""
        out: list[dict[str, Any]] = [{"term": {"tenant": scope.tenant}}, *_in_force(scope)]
        if scope.subject:
            out.append({"term": {"subject": scope.subject}})
        out += [{"terms": {name: list(vals)}} for name, vals in scope.filters.items()]
        if scope.time is not None:  # events and episodes only inside the time cue; other kinds regardless
            rng = {"gte": scope.time.start.isoformat(), "lt": scope.time.end.isoformat()}
            out.append(
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
            )
        if scope.entities:
            entities = list(scope.entities)
            about: list[dict[str, Any]] = [{"terms": {"entities": entities}}, {"terms": {"subject_ids": entities}}]
            if scope.outside:  # the open kinds' documents about none of them (recall.prefer)
                out.append({"bool": {"filter": [{"terms": {"kind": list(scope.open_kinds)}}], "must_not": about}})
            else:
                out.append({"bool": {"should": about, "minimum_should_match": 1}})
        elif scope.mentions:
            out.append(
                {
                    "bool": {
                        "should": [{"match": {"content": e}} for e in scope.mentions]
                        + [{"match": {"aliases_text": e}} for e in scope.mentions],
                        "minimum_should_match": 1,
                    }
                }
            )
        return out

    def exact_body(self, scope: Scope, keys: Sequence[str], event_types: Sequence[str], size: int) -> dict[str, Any]:
        filters = self.filters(scope)
        attrs = {f: v for f, v in (("key", keys), ("event_type", event_types)) if v}
        if attrs:
            filters.append(_terms_any(attrs))
        return {
            "query": {"bool": {"filter": filters}},
            "size": size,
            "sort": [{"valid_from": "desc"}, {"version_id": "asc"}],
        }

    def keyword_body(self, scope: Scope, text: str, size: int) -> dict[str, Any]:
        clauses: list[dict[str, Any]] = [
            {"combined_fields": {"query": text, "fields": KEYWORD_FIELDS, "minimum_should_match": KEYWORD_MIN_MATCH}}
        ]
        if stemmed := query_stems(text):  # none for a query with Han text: the first clause alone
            clauses.append({"match": {STEM_FIELD: {"query": stemmed, "minimum_should_match": self.stem_min_match}}})
        return {
            "query": {"bool": {"filter": self.filters(scope), "should": clauses, "minimum_should_match": 1}},
            "size": size,
        }

    @staticmethod
    def model_filter(model: str | None, without: str | None, legacy: bool = False) -> dict[str, Any]:
        """Documents with a vector of `model` (a vector of another model, before a reindex, is no neighbour) and
        none of `without`; `legacy`: documents that name no model (indexed before per-language models) count as
        `model`'s."""
        must: list[dict[str, Any]] = []
        if model is not None:
            has = {"term": {"embed_model": model}}
            unnamed = {"bool": {"must_not": {"exists": {"field": "embed_model"}}}}
            must = [{"bool": {"should": [has, unnamed], "minimum_should_match": 1}} if legacy else has]
        must_not = [{"term": {"embed_model": without}}] if without is not None else []
        return {"bool": {"filter": must, "must_not": must_not}}

    def nearest_body(
        self,
        scope: Scope,
        vector: Sequence[float],
        size: int,
        field: str = "embedding",
        model: str | None = None,
        without: str | None = None,
    ) -> dict[str, Any]:
        filters = self.filters(scope)
        if model is not None or without is not None:
            filters.append(self.model_filter(model, without, legacy=field == "embedding"))
        return {
            "knn": {
                "field": field,
                "query_vector": vector,
                "k": size,
                "num_candidates": max(100, size * 10),
                "filter": {"bool": {"filter": filters}},
            },
            "size": size,
        }

    # --- SearchIndex ----------------------------------------------------------------------------------

    async def _search(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            res = await self.es.search(
                index=self.index,
                track_total_hits=False,
                source=False,
                docvalue_fields=["memory_id", "event_type"],
                filter_path=["hits.hits._id", "hits.hits._score", "hits.hits.fields"],
                **body,
            )
        except NotFoundError:  # nothing indexed yet
            return []
        return res.get("hits", {}).get("hits", [])

    async def exact(self, scope: Scope, keys: Sequence[str], event_types: Sequence[str], size: int) -> list[Candidate]:
        hits = await self._search(self.exact_body(scope, keys, event_types, size))
        return [Candidate(h["_id"], h["fields"]["memory_id"][0]) for h in hits]

    async def keyword(self, scope: Scope, text: str, size: int) -> list[Candidate]:
        hits = await self._search(self.keyword_body(scope, text, size))
        return [Candidate(h["_id"], h["fields"]["memory_id"][0], h["_score"], (), scope.outside) for h in hits]

    async def has_model(self, tenant: str, model: str, without: str | None = None, legacy: bool = False) -> bool:
        query = {"bool": {"filter": [{"term": {"tenant": tenant}}, self.model_filter(model, without, legacy)]}}
        return bool(await self._search({"query": query, "size": 1, "terminate_after": 1}))

    async def nearest(
        self,
        scope: Scope,
        vector: Sequence[float],
        size: int,
        field: str = "embedding",
        model: str | None = None,
        without: str | None = None,
    ) -> list[Candidate]:
        hits = await self._search(self.nearest_body(scope, vector, size, field, model, without))
        out = []
        for h in hits:
            fields = h["fields"]  # Elasticsearch reports (1 + cosine) / 2
            types = tuple(fields.get("event_type", ()))
            out.append(Candidate(h["_id"], fields["memory_id"][0], 2 * h["_score"] - 1, types, scope.outside))
        return out

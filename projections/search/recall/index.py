"""The search-index port of recall: the few questions the stages ask (`SearchIndex`), and Elasticsearch's answers.

A stage says *what* it wants in the terms of `model.Scope` and `model.Candidate`; `ElasticIndex` turns that into
the query DSL of the index that `projections.search.mapping` defines and `projections.search.indexer` fills.
Another backend (OpenSearch, pgvector, an in-memory index for tests) implements `SearchIndex` and is handed to
`RecallEngine(..., index=...)`; nothing else in recall changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from elasticsearch import AsyncElasticsearch, NotFoundError

from projections.search.recall.model import Candidate, Scope

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

    async def nearest(self, scope: Scope, vector: Sequence[float], size: int) -> list[Candidate]:
        """The `size` documents in `scope` nearest to `vector`, nearest first; `score` is the cosine similarity,
        `event_types` the document's."""
        ...


KEYWORD_MIN_MATCH = "3<60%"  # of the query's analysed tokens (uni+bigrams, no stopwords): all of 1-3, else 60%
KEYWORD_FIELDS = ["content", "aliases_text^2", "key_text^1.5"]


def holds_at_filter(at: datetime) -> list[dict[str, Any]]:
    """The documents whose version holds at valid time `at`: valid_from <= at < valid_to (missing: open).

    A document's `valid_to` is the version's effective end, min(valid_to, superseded_at) (documents.status_fields),
    so this is the rule of projections.versions.holds_at. Overrides are not preferred here: the index returns
    every version that holds, and verification keeps the one that wins (projections.postgres.queries.visible_sql).
    """
    t = at.isoformat()
    return [
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


def _terms_any(fields: dict[str, Sequence[str]]) -> dict[str, Any]:
    return {"bool": {"should": [{"terms": {f: list(v)}} for f, v in fields.items()], "minimum_should_match": 1}}


class ElasticIndex:
    """`SearchIndex` over the Elasticsearch alias `index` (ids and memory ids from doc values: no _source read)."""

    def __init__(self, es: AsyncElasticsearch, index: str) -> None:
        self.es, self.index = es, index

    # --- the DSL -------------------------------------------------------------------------------------

    @staticmethod
    def filters(scope: Scope) -> list[dict[str, Any]]:
        """The bool filter of a scope (its size is bounded by the cues' bounds)."""
        out: list[dict[str, Any]] = [{"term": {"tenant": scope.tenant}}, *holds_at_filter(scope.at)]
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
            out.append(
                {
                    "bool": {
                        "should": [{"terms": {"entities": entities}}, {"terms": {"subject_ids": entities}}],
                        "minimum_should_match": 1,
                    }
                }
            )
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
        return {
            "query": {
                "bool": {
                    "filter": self.filters(scope),
                    "must": {
                        "combined_fields": {
                            "query": text,
                            "fields": KEYWORD_FIELDS,
                            "minimum_should_match": KEYWORD_MIN_MATCH,
                        }
                    },
                }
            },
            "size": size,
        }

    def nearest_body(self, scope: Scope, vector: Sequence[float], size: int) -> dict[str, Any]:
        return {
            "knn": {
                "field": "embedding",
                "query_vector": vector,
                "k": size,
                "num_candidates": max(100, size * 10),
                "filter": {"bool": {"filter": self.filters(scope)}},
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
        return [Candidate(h["_id"], h["fields"]["memory_id"][0], h["_score"]) for h in hits]

    async def nearest(self, scope: Scope, vector: Sequence[float], size: int) -> list[Candidate]:
        hits = await self._search(self.nearest_body(scope, vector, size))
        out = []
        for h in hits:
            fields = h["fields"]  # Elasticsearch reports (1 + cosine) / 2
            out.append(
                Candidate(h["_id"], fields["memory_id"][0], 2 * h["_score"] - 1, tuple(fields.get("event_type", ())))
            )
        return out

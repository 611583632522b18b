"""The Elasticsearch index: settings, mappings, physical names behind the alias.

The server build ships no analysis-common plugin (no `cjk`, `smartcn`, `ik`), so CJK
text uses what core has: the `standard` tokenizer (one token per Han character) +
`lowercase` + a `shingle` filter, i.e. unigrams and bigrams. "后端端口" and
"backend port" are then both searchable by BM25.

Nor does it ship a stemmer: `content_stem` holds English stems computed in Python
(projections.search.stemming) under the core `whitespace` analyzer. A field added to the
mapping later (ADDED_FIELDS) is put on an existing index by `ensure_index`, so a new
document can carry it; `ledger reindex` fills it for the documents written before.
"""

from __future__ import annotations

import time
from typing import Any

from elasticsearch import Elasticsearch, NotFoundError

from producers.settings import Settings
from projections.languages import EN_FIELD
from projections.models import model_spec

__all__ = ["ensure_index", "index_body", "new_physical_name", "physical_indices", "create_physical"]

STEM_MAPPING = {"type": "text", "analyzer": "whitespace"}  # built in: the stems are computed before indexing
# a version's asserted end and where it was logged, a superseded version's successor (its valid_from, when it was
# observed and where it was logged), a retracted one's retraction (the same) (documents.build_doc, status_fields):
# what a recall as known then filters on
KNOWN_THEN_FIELDS = {
    "asserted_valid_to": {"type": "date"},  # the end the version's own event asserted
    "partition": {"type": "integer"},
    "offset": {"type": "long"},
    "superseded_at": {"type": "date"},
    "successor_observed_at": {"type": "date"},
    "successor_partition": {"type": "integer"},
    "successor_offset": {"type": "long"},
    "retracted_at": {"type": "date"},  # the time a retraction ended it, and when and where that one was logged
    "retraction_observed_at": {"type": "date"},
    "retraction_partition": {"type": "integer"},
    "retraction_offset": {"type": "long"},
}
# fields added after indices existed: ensure_index puts them on an existing index (a mapping only grows)
ADDED_FIELDS = {
    "content_stem": STEM_MAPPING,
    # the near-duplicate group an episode belongs to (projections.search.duplicates): its first episode
    "episode_group": {"type": "keyword"},
    **KNOWN_THEN_FIELDS,
}

ANALYSIS = {
    "filter": {"bigram": {"type": "shingle", "max_shingle_size": 2}},
    "analyzer": {"cjk_bigram": {"tokenizer": "standard", "filter": ["lowercase", "bigram"]}},
}


HNSW = {"type": "hnsw"}


def _vector(dim: int) -> dict[str, Any]:
    return {"type": "dense_vector", "dims": dim, "similarity": "cosine", "index": True, "index_options": HNSW}


def vector_fields(settings: Settings, dim: int | None = None) -> dict[str, Any]:
    """The model-name field and the English model's vector field (projections.languages)."""
    return {"embed_model": {"type": "keyword"}, EN_FIELD: _vector(dim or model_spec(settings.embed_model_en).dim)}


def index_body(
    dim: int, *, shards: int = 1, replicas: int = 0, refresh_interval: str = "1s", en_dim: int | None = None
) -> dict[str, Any]:
    """Settings and strict mappings for one physical index of fact versions (`en_dim`: embedding_en's;
    None: the same as `dim`; `replicas`: LEDGER_ES_REPLICAS)."""
    keyword = {"type": "keyword"}
    text = {"type": "text", "analyzer": "cjk_bigram"}
    return {
        "settings": {
            "number_of_shards": shards,
            "number_of_replicas": replicas,
            "refresh_interval": refresh_interval,
            "analysis": ANALYSIS,
        },
        "mappings": {
            "dynamic": "strict",
            "properties": {
                "version_id": keyword,
                "memory_id": keyword,
                "tenant": keyword,
                "subject": keyword,
                "subject_ids": keyword,  # normalized subject and its bare id (cues.subject_ids)
                "key": keyword,
                "key_text": text,  # the key as words (`project backend port`)
                "scope": keyword,
                "kind": keyword,
                "status": keyword,
                "source_type": keyword,
                "event_type": keyword,
                "entities": keyword,  # normalized (cues.normalize_entity)
                "aliases": keyword,  # canonical (cues.canonical)
                "aliases_text": text,
                "tags": keyword,
                "superseded_by": keyword,
                "content": text,
                "content_stem": STEM_MAPPING,  # English stems of the content (projections.search.stemming)
                "episode_group": keyword,  # a near-duplicate episode's group (its first episode's id)
                "valid_from": {"type": "date"},
                "valid_to": {"type": "date"},  # effective end: min(valid_to, superseded_at)
                **KNOWN_THEN_FIELDS,
                "observed_at": {"type": "date"},
                "version": {"type": "integer"},
                "confidence": {"type": "float"},
                "importance": {"type": "float"},
                "embedding": _vector(dim),  # embed_model's vectors
                "embed_model": keyword,  # the model that made the document's vector
                "embedding_en": _vector(en_dim or dim),  # embed_model_en's vectors (projections.languages)
            },
        },
    }


def new_physical_name(alias: str) -> str:
    """`<alias>-<utc timestamp in ms>`: sortable, unique per reindex."""
    return f"{alias}-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}{int(time.time() * 1000) % 1000:03d}"


def physical_indices(es: Elasticsearch, alias: str) -> list[str]:
    """The physical indices the alias points at now (normally exactly one)."""
    try:
        return sorted(es.indices.get_alias(name=alias).keys())
    except NotFoundError:
        return []


def create_physical(es: Elasticsearch, alias: str, dim: int, **kw: Any) -> str:
    name = new_physical_name(alias)
    while es.indices.exists(index=name):
        time.sleep(0.002)
        name = new_physical_name(alias)
    es.indices.create(index=name, **index_body(dim, **kw))
    return name


_GROWN: set[str] = set()  # physical indices this process has put ADDED_FIELDS on (ensure_index runs every batch)


def _grow(es: Elasticsearch, name: str, settings: Settings) -> None:
    """Put ADDED_FIELDS on an index created before them, once per process (idempotent: the same definitions).

    The English vector field only where it is missing: an index whose `embedding_en` has another dimension than
    the configured English model's keeps it (its documents then fail to index, loudly: switching is a reindex)."""
    if name not in _GROWN:
        have = es.indices.get_mapping(index=name)[name]["mappings"].get("properties", {})
        added = {k: v for k, v in vector_fields(settings).items() if k not in have}
        es.indices.put_mapping(index=name, properties={**ADDED_FIELDS, **added})
        _GROWN.add(name)


def ensure_index(es: Elasticsearch, settings: Settings, dim: int) -> str:
    """Make sure the alias exists (creating its first physical index); return the physical name. Idempotent."""
    alias = settings.es_index
    current = physical_indices(es, alias)
    if current:
        _grow(es, current[-1], settings)
        return current[-1]
    name = create_physical(
        es, alias, dim, replicas=settings.es_replicas, en_dim=vector_fields(settings)["embedding_en"]["dims"]
    )
    try:
        es.indices.update_aliases(actions=[{"add": {"index": name, "alias": alias, "is_write_index": True}}])
    except Exception:
        es.indices.delete(index=name, ignore_unavailable=True)
        raise
    current = physical_indices(es, alias)
    if len(current) > 1:  # two processes raced to create it: keep the oldest, drop ours
        keep = current[0]
        if name != keep:
            es.indices.update_aliases(actions=[{"remove_index": {"index": name}}])
        return keep
    return name

"""The Elasticsearch index: settings, mappings, physical names behind the alias.

The server build ships no analysis-common plugin (no `cjk`, `smartcn`, `ik`), so CJK
text uses what core has: the `standard` tokenizer (one token per Han character) +
`lowercase` + a `shingle` filter, i.e. unigrams and bigrams. "后端端口" and
"backend port" are then both searchable by BM25.
"""

from __future__ import annotations

import time
from typing import Any

from elasticsearch import Elasticsearch, NotFoundError

from producers.settings import Settings

__all__ = ["ensure_index", "index_body", "new_physical_name", "physical_indices", "create_physical"]

ANALYSIS = {
    "filter": {"bigram": {"type": "shingle", "max_shingle_size": 2}},
    "analyzer": {"cjk_bigram": {"tokenizer": "standard", "filter": ["lowercase", "bigram"]}},
}


def index_body(dim: int, *, shards: int = 1, refresh_interval: str = "1s") -> dict[str, Any]:
    """Settings and strict mappings for one physical index of fact versions."""
    keyword = {"type": "keyword"}
    text = {"type": "text", "analyzer": "cjk_bigram"}
    return {
        "settings": {
            "number_of_shards": shards,
            "number_of_replicas": 0,
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
                "valid_from": {"type": "date"},
                "valid_to": {"type": "date"},  # effective end: min(valid_to, superseded_at)
                "observed_at": {"type": "date"},
                "version": {"type": "integer"},
                "confidence": {"type": "float"},
                "importance": {"type": "float"},
                "embedding": {
                    "type": "dense_vector",
                    "dims": dim,
                    "similarity": "cosine",
                    "index": True,
                    "index_options": {"type": "hnsw"},
                },
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


def ensure_index(es: Elasticsearch, settings: Settings, dim: int) -> str:
    """Make sure the alias exists (creating its first physical index); return the physical name. Idempotent."""
    alias = settings.es_index
    current = physical_indices(es, alias)
    if current:
        return current[-1]
    name = create_physical(es, alias, dim)
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

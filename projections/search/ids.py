"""Every document id of an index, or of the documents a query matches: `doc_ids` and `doc_ids_async`.

One scroll over the index (`elasticsearch.helpers.scan` / `async_scan`: a consistent snapshot, pages in
index order, the scroll context cleared at the end); no _source is read. Each of its requests keeps the client's
own timeout (the helpers' default, None, means none: a hung node held the caller for ever). An index that does not
exist (yet) has no documents. Used by the orphan check (projections.search.reindex), the indexer's erasure, bench eval.
"""

from __future__ import annotations

from typing import Any

from elastic_transport.client_utils import DEFAULT
from elasticsearch import AsyncElasticsearch, Elasticsearch, NotFoundError
from elasticsearch.helpers import async_scan, scan

__all__ = ["doc_ids", "doc_ids_async", "tenant_query"]

PAGE = 5000  # ids per scroll page
KEEP_ALIVE = "1m"  # between two pages
_SCROLL: dict[str, Any] = {"size": PAGE, "scroll": KEEP_ALIVE, "request_timeout": DEFAULT}  # DEFAULT: the client's


def tenant_query(tenant: str | None, **terms: str) -> dict[str, Any]:
    """The documents of `tenant` (None: every tenant) whose fields equal `terms` (e.g. subject=...)."""
    fields = ({"tenant": tenant} if tenant else {}) | terms
    if not fields:
        return {"match_all": {}}
    return {"bool": {"filter": [{"term": {name: value}} for name, value in fields.items()]}}


def _body(query: dict[str, Any] | None) -> dict[str, Any]:
    return {"query": query or {"match_all": {}}, "_source": False}


def doc_ids(es: Elasticsearch, index: str, query: dict[str, Any] | None = None) -> set[str]:
    """The ids of the documents of `index` matching `query` (None: all)."""
    try:
        return {h["_id"] for h in scan(es, query=_body(query), index=index, **_SCROLL)}
    except NotFoundError:
        return set()


async def doc_ids_async(es: AsyncElasticsearch, index: str, query: dict[str, Any] | None = None) -> set[str]:
    """`doc_ids` for an async client."""
    try:
        return {h["_id"] async for h in async_scan(es, query=_body(query), index=index, **_SCROLL)}
    except NotFoundError:
        return set()

"""Elasticsearch clients that encode JSON with orjson, requests and bulk bodies alike.

The client's default serializers use the standard library's `json`: profiled in the 100k bench, the
indexer spent 40% of its CPU in `JSONEncoder.iterencode`, encoding the float lists of the documents' vectors for
`_bulk`. elastic_transport ships an orjson serializer for `application/json` only; the NDJSON one (what `_bulk`
sends) encodes each line with the base class's `json`, so it is given orjson here too. The compatibility-mode
mimetypes follow their plain ones (the client maps them). Every process of ours builds its client here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from elasticsearch import AsyncElasticsearch, Elasticsearch
from elasticsearch.serializer import NdjsonSerializer, OrjsonSerializer

__all__ = ["SERIALIZERS", "OrjsonNdjsonSerializer", "async_es_client", "es_client", "nodes"]


class OrjsonNdjsonSerializer(NdjsonSerializer):
    """NDJSON (`_bulk`, `_msearch`) with each line encoded by orjson; the client's `default` for what orjson lacks."""

    def json_dumps(self, data: Any) -> bytes:
        return orjson.dumps(data, default=self.default, option=orjson.OPT_SERIALIZE_NUMPY)

    def json_loads(self, data: bytes) -> Any:
        return orjson.loads(data)


SERIALIZERS = {"application/json": OrjsonSerializer(), "application/x-ndjson": OrjsonNdjsonSerializer()}


def nodes(url: str | Sequence[str]) -> list[str]:
    """The node URLs of `url`: one URL, several separated by commas (`LEDGER_ES_URL`), or a list of them."""
    urls = url.split(",") if isinstance(url, str) else url
    return [u.strip() for u in urls if u.strip()]


def es_client(url: str | Sequence[str], request_timeout: float, **kw: Any) -> Elasticsearch:
    """A synchronous client of `url`'s nodes (see `nodes`) with the orjson serializers. With several nodes the
    client takes them in turn and sends a request that could not reach one to the next (a node it could not reach
    rests a while): on a cluster with replicas a stopped node costs a retry, not an error."""
    return Elasticsearch(nodes(url), request_timeout=request_timeout, serializers=SERIALIZERS, **kw)


def async_es_client(url: str | Sequence[str], request_timeout: float, **kw: Any) -> AsyncElasticsearch:
    """An asyncio client of `url`'s nodes with the orjson serializers (the API's)."""
    return AsyncElasticsearch(nodes(url), request_timeout=request_timeout, serializers=SERIALIZERS, **kw)

"""Elasticsearch clients that encode JSON with orjson, requests and bulk bodies alike.

The client's default serializers use the standard library's `json`, which dominated the indexer's CPU encoding
vectors for `_bulk` (BENCHMARKS.md); elastic_transport's orjson serializer covers `application/json` only, so the
NDJSON one gets orjson here too. Every process builds its client here, from LEDGER_ES_URL (a user and password in it
become the Authorization header) and the TLS files of LEDGER_ES_CA_CERTS / _CLIENT_CERT / _CLIENT_KEY (`es_tls`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from elasticsearch import AsyncElasticsearch, Elasticsearch
from elasticsearch.serializer import NdjsonSerializer, OrjsonSerializer

from producers.settings import ElasticsearchSettings

__all__ = ["SERIALIZERS", "OrjsonNdjsonSerializer", "async_es_client", "es_client", "es_tls", "nodes"]


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


def es_tls(settings: ElasticsearchSettings) -> dict[str, str]:
    """The client's TLS keywords from the settings: `ca_certs` (the nodes' certificates are checked against it; the
    system's CAs when unset), `client_cert` and `client_key`. Empty for the default settings."""
    s = settings
    files = {"ca_certs": s.es_ca_certs, "client_cert": s.es_client_cert, "client_key": s.es_client_key}
    return {name: str(path) for name, path in files.items() if path is not None}


Target = ElasticsearchSettings | str | Sequence[str]


def _connection(target: Target, kw: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """A settings object gives its nodes and its TLS files (`kw` wins); a URL or URLs give the nodes only."""
    if isinstance(target, ElasticsearchSettings):
        return nodes(target.es_url), {**es_tls(target), **kw}
    return nodes(target), kw


def es_client(target: Target, request_timeout: float, **kw: Any) -> Elasticsearch:
    """A synchronous client of `target`'s nodes (the settings' `es_url` and TLS files, or URLs: see `nodes`) with
    the orjson serializers. With several nodes the client takes them in turn and sends a request that could not
    reach one to the next (a node it could not reach rests a while): on a cluster with replicas a stopped node costs
    a retry, not an error."""
    hosts, options = _connection(target, kw)
    return Elasticsearch(hosts, request_timeout=request_timeout, serializers=SERIALIZERS, **options)


def async_es_client(target: Target, request_timeout: float, **kw: Any) -> AsyncElasticsearch:
    """An asyncio client of `target`'s nodes with the orjson serializers (the API's)."""
    hosts, options = _connection(target, kw)
    return AsyncElasticsearch(hosts, request_timeout=request_timeout, serializers=SERIALIZERS, **options)

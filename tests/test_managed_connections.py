"""What docs/deploy.md says about managed PostgreSQL and Elasticsearch, against the local servers.

The TLS and authentication of a managed store ride in the two addresses: LEDGER_PG_DSN's libpq parameters
(`sslmode`, `sslrootcert`, a password) and LEDGER_ES_URL's user and password. These tests check that the ledger's
own connection code hands them on unchanged: a DSN demanding TLS of the local server (which has none) is refused by
libpq, not quietly connected in the clear; an Elasticsearch URL's credentials become the Authorization header of
every node, a comma in a password percent-encoded (LEDGER_ES_URL separates nodes by commas).
"""

from __future__ import annotations

import base64
from urllib.parse import quote

import psycopg
import pytest

from producers.settings import Settings
from projections.postgres.connection import connect
from projections.search.client import es_client


def _with_params(dsn: str, params: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}{params}"


def test_a_dsn_that_demands_tls_is_never_answered_in_the_clear(base_settings: Settings) -> None:
    with psycopg.connect(base_settings.pg_dsn) as conn:
        server_tls = conn.execute("SHOW ssl").fetchone()[0] == "on"
    dsn = _with_params(base_settings.pg_dsn, "sslmode=require&connect_timeout=3")
    if server_tls:  # a server with TLS: the connection is encrypted
        with connect(dsn, base_settings.pg_schema) as conn:
            assert conn.info.pgconn.ssl_in_use
        return
    with pytest.raises(psycopg.OperationalError, match="SSL"):
        connect(dsn, base_settings.pg_schema)
    with connect(_with_params(base_settings.pg_dsn, "sslmode=prefer"), base_settings.pg_schema) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)  # prefer: TLS where the server has it


def test_credentials_in_the_es_url_reach_every_node(base_settings: Settings) -> None:
    password = "p,w:@é"  # a comma would split LEDGER_ES_URL into two nodes unless percent-encoded
    host = base_settings.es_url.split("://", 1)[1].split(",")[0]
    es = es_client(f"http://ledger:{quote(password, safe='')}@{host}", request_timeout=5)
    try:
        nodes = es.transport.node_pool.all()
        assert len(nodes) == 1  # the encoded comma did not split the URL
        expected = "Basic " + base64.b64encode(f"ledger:{password}".encode()).decode()
        assert all(n.config.headers["authorization"] == expected for n in nodes)
        assert es.cluster.health()["status"] in ("green", "yellow")  # the local server has no security: ignored
    finally:
        es.close()

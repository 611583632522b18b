"""The search side when Elasticsearch hangs: every request it sends is bounded, and its failures are counted as its.

An id scan (the indexer's erasure, the orphan check of `GET /v1/stats/consistency`) went through the client's
scroll helpers, whose default timeout, None, means none: against a node that takes the connection and never
answers, the scan waited for ever, holding the indexer's transaction or the API's slot and pool connection. A
timeout was counted as an error of no store ("other") with a traceback.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from elastic_transport import ConnectionTimeout

from projections.postgres.connection import held
from projections.search.client import async_es_client, es_client
from projections.search.drain import _store
from projections.search.ids import doc_ids, doc_ids_async
from tests.test_cli_store_errors import silent_port

TIMEOUT_S = 1.0  # the client's own
BOUND_S = 30.0  # far past the client's timeout (and its retries), far below "for ever"


def test_an_id_scan_of_a_silent_node_ends_with_the_clients_timeout() -> None:
    with silent_port() as port, ThreadPoolExecutor(1) as pool:
        url = f"http://127.0.0.1:{port}"
        es = es_client(url, request_timeout=TIMEOUT_S)
        started = time.monotonic()
        with pytest.raises(ConnectionTimeout):
            pool.submit(doc_ids, es, "any-index").result(timeout=BOUND_S)
        assert time.monotonic() - started < BOUND_S

        async def scan() -> set[str]:
            client = async_es_client(url, request_timeout=TIMEOUT_S)
            try:
                return await asyncio.wait_for(doc_ids_async(client, "any-index"), BOUND_S)
            finally:
                await client.close()

        with pytest.raises(ConnectionTimeout):
            asyncio.run(scan())


def test_an_elasticsearch_timeout_counts_as_elasticsearchs() -> None:
    assert _store(ConnectionTimeout("read timed out")) == "elasticsearch"


def test_a_workers_connection_to_a_silent_postgres_gives_up_at_the_configured_timeout(base_settings) -> None:
    """The search workers' and the projector's connections took libpq's default: 130 s on a server that takes the
    connection and never answers, with nothing logged. They take LEDGER_PG_CONNECT_TIMEOUT_S (and keepalives)."""
    import psycopg

    from projections.postgres.positioned import connect
    from projections.search.drain import _connect

    with silent_port() as port:
        settings = base_settings.model_copy(
            update={"pg_dsn": f"postgresql://ledger@127.0.0.1:{port}/ledger", "pg_connect_timeout_s": 2}
        )
        for opening in (
            lambda: _connect(settings, ()),
            lambda: connect(settings.pg_dsn, settings.pg_schema, **held(settings)),
        ):
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                opening()
            assert time.monotonic() - started < BOUND_S

"""`GET /v1/stats` gives one name one meaning: a top-level key spelled like a key of a section
(`search_outbox_pending` next to `search.outbox_pending`) must be that same number, and the search projection's
whole backlog (documents to write plus vectors to compute) has a name of its own, `search_pending`.

Checked on real answers while each queue holds work in turn (the outbox before an indexer ran, the embed queue
after), since two names for two things only differ while the things do.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from api.main import create_app
from projections.search.indexer import drain_once
from tests.conftest import unique
from tests.support import RecorderWriter as Ledger
from tests.support import embed_queue_count, outbox_count, private_store

TENANT, KEY = "statsnames", "k-stats-names"


def _same_name_other_meaning(body: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Top-level keys named `<section>_<key>` of a section's key whose value differs from that key's."""
    clashes = []
    for section, inner in body.items():
        if not isinstance(inner, dict):
            continue
        for key, value in inner.items():
            top = f"{section}_{key}"
            if top in body and body[top] != value:
                clashes.append((top, body[top], value))
    return clashes


def test_each_stats_name_means_one_number(base_settings: Any) -> None:
    settings = base_settings.private(unique("sn"), api_keys={KEY: [TENANT]})
    with private_store(settings) as (conn, es), Ledger(settings, conn) as ledger:
        for port in (8080, 8081):
            ledger.assert_fact(TENANT, f"project:{port}", "project.port", f"port {port}", port)
        with TestClient(create_app(settings)) as client:

            def stats() -> dict[str, Any]:
                r = client.get("/v1/stats", headers={"X-API-Key": KEY}, params={"tenant": TENANT})
                assert r.status_code == 200, r.text
                return r.json()

            seen, clashes, backlog = [], [], []
            for queues in ((2, 0), (0, 2)):  # documents to write, then (an indexer ran) vectors to compute
                assert (outbox_count(conn), embed_queue_count(conn)) == queues
                body = stats()
                seen.append((body["search"]["outbox_pending"], body["search"]["vectors_pending"]))
                clashes += _same_name_other_meaning(body)
                backlog.append(body.get("search_pending"))
                drain_once(settings, conn, es, refresh=True)
            assert seen == [(2, 0), (0, 2)]
            assert clashes == []
            assert backlog == [2, 2]  # documents plus vectors, whichever queue holds them

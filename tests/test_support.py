"""The test support layer itself: a child process gets exactly the test's settings, `pipeline`
brings the whole ledger up (worker and `ledger indexer` as subprocesses, the app) and reports a
process that died instead of waiting for it, a private store never takes (and drops) a schema that exists, and a
backlog is waited for as long as it shrinks and no longer once it stops.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import orjson
import pytest

from producers.settings import REPO_ROOT, Settings
from projections.postgres.positions import wait_for_positions
from tests.conftest import unique
from tests.support import asserted, pipeline
from tests.support.stores import private_schema, private_store
from tests.support.waiting import wait_drained


def test_a_child_process_reads_exactly_these_settings(settings: Settings) -> None:
    mine = settings.model_copy(update={"api_keys": {"k": ["acme"]}, "processor_batch_size": 7, "embed_model_dir": None})
    code = "from producers.settings import Settings; print(Settings().model_dump_json())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=mine.child_environ(), cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert orjson.loads(out.stdout) == orjson.loads(mine.model_dump_json())


def test_waiting_for_positions_that_never_come_names_them(settings: Settings) -> None:
    with pytest.raises(TimeoutError, match=r"\{0: 1\}"):
        wait_for_positions(settings, {0: 1}, timeout=0.3, interval=0.1)


def test_a_backlog_is_waited_for_while_it_shrinks_and_fails_once_it_stops() -> None:
    shrinking = iter([None, 5, 5, 4, 3, 3, 2, 1, 0])  # each step within the stall window, the whole far beyond it
    asked: list[int | None] = []

    def slow() -> int | None:
        asked.append(next(shrinking))
        time.sleep(0.05)
        return asked[-1]

    wait_drained(slow, stall=0.5, interval=0.05)  # ~0.1 s a step, ~0.9 s in all
    assert asked[-1] == 0 and len(asked) == 9
    stuck = iter([3, 2, 4] + [2] * 1000)  # shrinks once, then grows and returns to its lowest without going below
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"still 2 after 0.2s without going below 2"):
        wait_drained(lambda: next(stuck), stall=0.2, interval=0.01, what="queue")
    assert 0.2 <= time.monotonic() - t0 < 5


def test_the_pipeline_applies_indexes_and_answers_and_reports_a_dead_indexer(base_settings: Settings) -> None:
    settings = base_settings.private(unique("pipe"), api_keys={"k": ["acme"]})
    with pipeline(settings, seed=[asserted("user:1", "pref.drink", "tea", 0)], app=True) as pipe:
        assert pipe.client is not None and pipe.indexer is not None
        headers = {"X-API-Key": "k"}
        r = pipe.client.post("/v1/recall", json={"tenant": "acme", "query": "user:1 pref.drink"}, headers=headers)
        assert r.status_code == 200 and [h["value"] for h in r.json()["hits"]] == ["tea"], r.text
        pipe.publish([asserted("user:1", "pref.drink", "coffee", 1)])
        pipe.settle()
        search = pipe.client.get("/v1/stats", params={"tenant": "acme"}, headers=headers).json()["search"]
        assert (search["pg_versions"], search["es_documents"], search["outbox_pending"]) == (2, 2, 0)
        pipe.indexer.kill()
        with pytest.raises(AssertionError, match="indexer exited"):
            pipe.settle()


@pytest.mark.parametrize("store", [private_schema, private_store])
def test_a_private_store_refuses_a_schema_that_exists(settings: Settings, store: Any) -> None:
    """Given settings whose schema exists (a development stack's own, say), a private store would drop it after:
    it refuses before touching it, and the schema and its rows are still there."""
    with private_schema(settings) as conn:
        conn.execute("INSERT INTO meta (name, value) VALUES ('kept', 'yes')")
        with pytest.raises(AssertionError, match="exists"), store(settings):
            pass
        assert conn.execute("SELECT value FROM meta WHERE name = 'kept'").fetchone() == ("yes",)

"""The test support layer itself: a child process gets exactly the test's settings, and `pipeline`
brings the whole ledger up (worker and `ledger indexer` as subprocesses, the app) and reports a
process that died instead of waiting for it.
"""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from producers.settings import REPO_ROOT, Settings
from projections.postgres.positions import wait_for_positions
from tests.conftest import unique
from tests.support import asserted, pipeline


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

"""`python -m infra up --service` runs LEDGER_INDEXERS indexers and LEDGER_EMBEDDERS embedders.

Pure: the instance names (pid file and log of each), the metrics port each one gets, and that `down` looks for
more instances than are configured (a lowered count still stops the extra ones).
"""

from __future__ import annotations

import pytest

from infra import service
from producers.settings import Settings

pytestmark = pytest.mark.unit


def test_each_instance_has_its_name_and_metrics_port():
    s = Settings(indexers=3, embedders=2, indexer_metrics_port=9102, embedder_metrics_port=9120)
    assert service.instances(s, "indexer") == ["indexer", "indexer-2", "indexer-3"]
    assert service.instances(s, "embedder") == ["embedder", "embedder-2"]
    assert service.instances(s, "worker") == ["worker"] and service.instances(s, "api") == ["api"]
    ports = {
        i: service._env(s, "indexer", i).get("LEDGER_INDEXER_METRICS_PORT") for i in service.instances(s, "indexer")
    }
    assert ports == {"indexer": "9102", "indexer-2": "9103", "indexer-3": "9104"}
    assert service._env(s, "embedder", "embedder-2")["LEDGER_EMBEDDER_METRICS_PORT"] == "9121"


def test_a_port_of_zero_stays_off_for_every_instance():
    s = Settings(indexers=2, indexer_metrics_port=0)
    assert service._env(s, "indexer", "indexer-2")["LEDGER_INDEXER_METRICS_PORT"] == "0"


def test_down_looks_past_the_configured_count():
    s = Settings(indexers=1)
    every = service.instances(s, "indexer", every=True)
    assert every[0] == "indexer" and len(every) == service.MAX_INSTANCES and "indexer-16" in every


def test_a_live_process_whose_command_line_reads_empty_is_still_starting(tmp_path, monkeypatch):
    """The liveness probe during `up`: caught mid-exec, /proc/<pid>/cmdline reads empty for a moment ("alive True,
    command line ''" failed `make demo`); that is no exit. A dead pid, or a live one running something else, is."""
    import os
    import subprocess

    s = Settings(data_dir=tmp_path)
    s.run_dir.mkdir(parents=True)
    (s.run_dir / "indexer.pid").write_text(str(os.getpid()))  # alive, but not an indexer's command line
    assert service._alive(s, "indexer") is False
    monkeypatch.setattr(service, "cmdline", lambda pid: "")
    assert service._alive(s, "indexer") is True  # mid-exec: the next probe tells
    dead = subprocess.Popen(["true"])
    dead.wait()
    (s.run_dir / "indexer.pid").write_text(str(dead.pid))
    assert service._alive(s, "indexer") is False and "alive False" in service._last_seen["indexer"]

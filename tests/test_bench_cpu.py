"""The benchmarks count a process's CPU only until its own stage caught up (bench.catchup.CaughtUpCpu): the worker's
idle wait while the indexer and the embedder catch up is not a cost of the events it applied."""

from __future__ import annotations

import os
import time

import pytest

from bench.catchup import CaughtUpCpu, Progress

pytestmark = pytest.mark.unit


def _progress(applied: int) -> Progress:
    return Progress(ends={0: 10}, positions={0: applied}, outbox=0, versions=0, es_docs=0)


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_is_counted_until_the_stage_caught_up_and_not_after() -> None:
    # the embedder's is taken elsewhere; `worker-2`, `indexer-3` are their kind's stage (`bench run --workers 2`)
    named = {"worker": os.getpid(), "embedder": os.getpid(), "worker-2": os.getpid(), "indexer-3": os.getpid()}
    assert set(CaughtUpCpu(named).pids) == {"worker", "worker-2", "indexer-3"}
    caught = CaughtUpCpu({"worker": os.getpid(), "embedder": os.getpid()})
    assert set(caught.pids) == {"worker"}
    _spin(0.2)
    caught(_progress(5))  # not caught up yet: nothing taken
    assert caught.at == {}
    assert caught.used("worker") >= 0.15  # until now, while it has not
    caught(_progress(10))
    at = caught.used("worker")
    _spin(0.3)  # idle for the stage, busy for the test: not counted
    caught(_progress(10))
    assert caught.used("worker") == at
    assert 0.15 <= at < 0.45

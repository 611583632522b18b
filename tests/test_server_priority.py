"""The local Elasticsearch that `infra up` started runs at LEDGER_ES_NICE, its session's autogroup too: on a host
shared with the projection, PostgreSQL and the worker get the cores first (README, "Scaling out")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra import elasticsearch
from producers.settings import Settings


def test_the_local_elasticsearch_runs_at_its_lower_priority(base_settings: Settings):
    if "elasticsearch" not in base_settings.managed:
        pytest.skip("Elasticsearch is external (LEDGER_MANAGED): its priority is its operator's")
    pid = elasticsearch.pid(base_settings)
    assert pid is not None, "the managed Elasticsearch is not running: `python -m infra up`"
    want = base_settings.es_nice
    restart = "started with another LEDGER_ES_NICE? `python -m infra down`, then `up`"
    # the server JVM's own nice value (its threads start with it): lowered by that much from whoever ran `up`
    nice = os.getpriority(os.PRIO_PROCESS, pid)
    assert nice >= want, f"Elasticsearch runs at nice {nice}: {restart}"
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():  # a kernel with autogroups: the server's session weighs less than the worker's
        assert autogroup.read_text().split()[-1] == str(want), f"{autogroup.read_text()}: {restart}"

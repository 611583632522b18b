"""The local Elasticsearch that `infra up` started runs at LEDGER_ES_NICE, its session's autogroup too: on a host
shared with the projection, PostgreSQL and the worker get the cores first (README, "Scaling out")."""

from __future__ import annotations

import os
from pathlib import Path

from infra import elasticsearch
from producers.settings import Settings


def test_the_local_elasticsearch_runs_at_its_lower_priority(base_settings: Settings):
    pid = elasticsearch.pid(base_settings)
    assert pid is not None, "the suite runs against the Elasticsearch `infra up` started (LEDGER_MANAGED)"
    # the server JVM's own nice value (its threads start with it) is at least that much below ours
    assert os.getpriority(os.PRIO_PROCESS, pid) >= os.getpriority(os.PRIO_PROCESS, 0) + base_settings.es_nice
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():  # a kernel with autogroups: the server's session weighs less than the worker's
        assert autogroup.read_text().split()[-1] == str(base_settings.es_nice), autogroup.read_text()

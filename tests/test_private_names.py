"""Two runs started in the same second never share private names (topic, schema, index): one's clean-up would drop
the other's data mid-run. Benchmarks name their runs by the second they start; the names add a random part."""

from __future__ import annotations

import subprocess
import sys

import pytest

from producers.settings import get_settings

pytestmark = pytest.mark.unit

STAMP = "20261202T161339Z"
NAMES = """
from bench.run import private_settings
from producers.settings import get_settings
s = private_settings(get_settings(), "{stamp}")
print(s.topic, s.pg_schema, s.es_index, s.processor_group)
"""


def test_benchmarks_started_in_the_same_second_get_names_of_their_own() -> None:
    from bench.run import private_settings

    first, second = (private_settings(get_settings(), STAMP) for _ in range(2))
    for field in ("topic", "dlq_topic", "access_topic", "pg_schema", "es_index", "processor_group"):
        assert getattr(first, field) != getattr(second, field), field
    assert STAMP.lower() in first.pg_schema  # still found by its start time


def test_two_processes_with_the_same_stamp_get_different_names() -> None:
    runs = [
        subprocess.run([sys.executable, "-c", NAMES.format(stamp=STAMP)], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    names = [set(r.stdout.split()) for r in runs]
    assert names[0] and not names[0] & names[1]

"""The fault suite runs LAST, is marked `faults`, heals the stack, and prints its figures.

- Ordering: `pytest_collection_modifyitems` moves every test under tests/faults/ behind all the
  others (they stop and start servers; nothing should run after them but them).
- Healing: a session fixture checks after the last fault test that every server infra manages
  here is up and healthy again (and starts it if not), so a failed test never leaves a broken stack.
- Figures: `pytest_terminal_summary` prints `support.TALLY` and writes it to
  `.data/faults-summary.json` (repo root), so the numbers can be quoted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from producers.settings import REPO_ROOT, Settings
from tests.faults.support import SERVERS, TALLY, ensure_server_up

FAULTS_DIR = Path(__file__).resolve().parent
SUMMARY_PATH = REPO_ROOT / ".data" / "faults-summary.json"
_started: list[float] = []


def _is_fault_test(item: pytest.Item) -> bool:
    return FAULTS_DIR in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    faults = [i for i in items if _is_fault_test(i)]
    if not faults:
        return
    for item in faults:
        item.add_marker(pytest.mark.faults)
    others = [i for i in items if not _is_fault_test(i)]
    items[:] = others + faults  # stable: the fault modules keep their own order among themselves


@pytest.fixture(scope="session", autouse=True)
def _heal_stack_after_faults(base_settings: Settings) -> Iterator[None]:
    """Whatever happened in the fault tests, leave every server infra manages here running and healthy."""
    _started.append(time.monotonic())
    yield
    problems = []
    for part in SERVERS:
        if part not in base_settings.managed:
            continue  # external: not ours to start
        try:
            ensure_server_up(part, base_settings)
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            problems.append(f"{part}: {exc}")
    assert not problems, f"the stack was left unhealthy after the fault suite: {problems}"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _started:
        return  # no fault test ran in this session
    TALLY.timings_s["suite"] = round(time.monotonic() - _started[0], 1)
    data = TALLY.as_dict()
    SUMMARY_PATH.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY_PATH.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    tr = terminalreporter
    tr.write_sep("=", "fault suite summary")
    for name in (
        "events_injected",
        "malformed_injected",
        "faults_injected",
        "events_lost",
        "events_applied_twice",
        "dlq_count",
        "dlq_wrong_reason",
        "http_requests",
        "http_5xx",
    ):
        tr.write_line(f"{name:>22}: {data[name]}")
    for name, seconds in sorted(data["timings_s"].items()):
        tr.write_line(f"{'time ' + name:>22}: {seconds}s")
    for note in data["notes"]:
        tr.write_line(f"  note: {note}")
    tr.write_line(f"(written to {SUMMARY_PATH})")

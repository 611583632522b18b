"""A large publish's judging in a child process (api.offload.Offload, api.judging.judge): the same verdicts as
judged in this process, and a child that dies is replaced without failing a call."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from api.judging import Judged, judge
from api.offload import Offload

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
SKEW = timedelta(seconds=300)


def _event(i: int, **fields: Any) -> dict[str, Any]:
    return {
        "event_id": f"e-{i}",
        "type": "memory.asserted",
        "tenant": "acme",
        "subject": f"user:{i % 7}",
        "key": f"k.{i}",
        "value": f"v{i}",
        "content": f"fact {i}",
        "observed_at": "2026-12-06T11:00:00Z",
    } | fields


def _requests() -> list[list[Any]]:
    """Requests whose verdicts cover every branch: valid, invalid (a NUL byte, a time past the skew, not an object,
    a dead letter named), an id repeated with the same event and with another, deep and large values."""
    events: list[Any] = [_event(i) for i in range(150)]
    events[3] = _event(3, value="nul\x00byte")
    events[4] = _event(4, observed_at="2027-01-01T00:00:00Z")
    events[5] = "not an object"
    events[6] = _event(6, dead_letter={"partition": 0, "offset": 1})
    events[7] = _event(0)  # the same event as events[0]: a repeat
    events[8] = _event(1, value="other")  # the id of events[1] with other content: a conflict
    deep: Any = "leaf"
    for _ in range(40):
        deep = {"d": deep}
    events[9] = _event(9, value=deep)
    events[10] = _event(10, value="x" * 60_000)
    events[11] = _event(11, value=json.loads("[" * 600 + "]" * 600))  # deeper than pickle goes: judged here
    return [events, [_event(0)], [None]]


def _verdicts(judged: Judged) -> tuple:
    return (
        judged.results,
        {k: (i, e.model_dump()) for k, (i, e) in judged.first.items()},
        judged.fingerprints,
        [(i, e.model_dump(), j) for i, e, j in judged.repeats],
        [(i, e.model_dump(), j) for i, e, j in judged.others],
    )


def _with_offload(body: Callable[[Offload], Awaitable[None]]) -> None:
    """`body` given a new Offload, on an event loop; the Offload closed after (again, if `body` closed it)."""

    async def run() -> None:
        offload = Offload(("api.judging",))
        try:
            await body(offload)
        finally:
            offload.close()

    asyncio.run(run())


def test_a_child_judges_every_request_as_this_process_does() -> None:
    async def body(offload: Offload) -> None:
        for events in _requests():
            in_a_child = await offload.run(judge, events, NOW, SKEW, False)
            assert _verdicts(in_a_child) == _verdicts(judge(events, NOW, SKEW, False))
        verdicts = _verdicts(await offload.run(judge, _requests()[0], NOW, SKEW, False))
        assert [r["error"]["code"] if r else None for r in verdicts[0][3:9]] == [
            "unstorable_text",
            "clock_skew",
            "not_an_object",
            "invalid_value",
            None,
            None,  # an earlier event's id with other content: answered once the ledger is asked (`others`)
        ], verdicts[0][3:9]
        assert verdicts[0][11]["error"]["code"] == "too_deep", verdicts[0][11]
        assert [(i, j) for i, _, j in verdicts[3]] == [(7, 0)]
        assert [(i, j) for i, _, j in verdicts[4]] == [(8, 1)]

    _with_offload(body)


def test_a_child_that_died_is_replaced_and_no_call_fails() -> None:
    async def body(offload: Offload) -> None:
        child = await offload.run(os.getpid)
        assert child != os.getpid()
        os.kill(child, signal.SIGKILL)
        answered: list[int] = []
        deadline = time.monotonic() + 60
        while not answered or answered[-1] in (child, os.getpid()):  # until a new child answers
            assert time.monotonic() < deadline, f"no new child: {answered}"
            answered.append(await offload.run(os.getpid))  # never raises: the dead child's call runs here
        assert answered[-1] not in (child, os.getpid())
        assert child not in answered[1:]  # a dead child is never given a call again

    _with_offload(body)


def test_after_close_a_call_runs_here_and_starts_no_child() -> None:
    """A request still being served while the server stops is answered, and leaves no pool nothing would close."""

    async def body(offload: Offload) -> None:
        assert await offload.run(os.getpid) != os.getpid()
        offload.close()
        assert await offload.run(os.getpid) == os.getpid()
        assert offload._pool is None

    _with_offload(body)


_KILLED_PARENT = """
import asyncio, os, sys, time
from api.offload import Offload
offload = Offload(("api.judging",))
print(asyncio.run(offload.run(os.getpid)), flush=True)
time.sleep(600)
"""


def test_a_child_ends_when_its_parent_is_killed() -> None:
    """A parent killed with SIGKILL runs no clean-up: its children (and the pool's resource tracker) go on their
    own, not wait for calls forever."""
    parent = subprocess.Popen([sys.executable, "-c", _KILLED_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert child != parent.pid
        os.kill(child, 0)  # alive
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 30
        while _alive(child):
            assert time.monotonic() < deadline, f"child {child} outlived its killed parent"
            time.sleep(0.2)
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited and waiting for init to reap it, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


_SIBLING_KILLED = """
import asyncio, os, signal, time
from api.offload import Offload

def pid_after(seconds):
    time.sleep(seconds)
    return os.getpid()

async def main():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a supervisor may leave it: children inherit it through exec
    for attempt in range(8):  # which of two idle children holds the queue's lock is chance: each one killed in turn
        offload = Offload(("api.judging",), children=2)  # two on any machine: a child with a sibling
        pids = await asyncio.gather(offload.run(pid_after, 0.5), offload.run(pid_after, 0.5))
        assert pids[0] != pids[1], "two children"
        await asyncio.sleep(0.2)  # both idle again, one of them holding the lock
        os.kill(pids[attempt % 2], signal.SIGKILL)
        for _ in range(3):
            await offload.run(os.getpid)
        offload.close()


if __name__ == "__main__":
    asyncio.run(main())
    print("done", flush=True)
"""


def test_a_process_whose_child_died_beside_another_still_exits(tmp_path: Path) -> None:
    """A child killed beside a sibling: the process that owns them ends when it is done. Python 3.11's pool stops the
    sibling with SIGTERM, which a process that ignores SIGTERM passes on to its children, and joins it: the sibling
    waited forever on a lock the dead child held, and the process never exited (a test run hung so at its end)."""
    script = tmp_path / "sibling_killed.py"  # a file: the children import its `pid_after` from it
    script.write_text(_SIBLING_KILLED)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=Path.cwd())
    assert run.returncode == 0 and "done" in run.stdout, run.stderr[-2000:]

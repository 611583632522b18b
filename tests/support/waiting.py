"""`wait_for`: poll a condition instead of sleeping blindly; `wait_drained`: poll a backlog down to zero."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["wait_drained", "wait_for"]


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = "condition") -> Any:
    """Return `cond()`'s first truthy value; AssertionError (with the last value) after `timeout` seconds.

    `cond` is asked once more at the deadline, so a condition that turns true while we slept still counts.
    """
    deadline = time.monotonic() + timeout
    while True:
        last = cond()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def wait_drained(count: Callable[[], int | None], stall: float, interval: float = 0.2, what: str = "backlog") -> None:
    """Until `count()` is 0; AssertionError once it has not gone below its lowest value for `stall` seconds.

    A backlog that a slow or busy host works off slowly is converging and is waited for; one that stops shrinking
    is not, and fails as soon as a timeout would. How fast it drains is a benchmark's question, not a test's. `count`
    may return None (not countable yet), which is no progress.
    """
    lowest: int | None = None
    deadline = time.monotonic() + stall
    while True:
        last = count()
        if last == 0:
            return
        if last is not None and (lowest is None or last < lowest):
            lowest, deadline = last, time.monotonic() + stall
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: still {last!r} after {stall:g}s without going below {lowest!r}")
        time.sleep(interval)

"""`wait_for`: poll a condition instead of sleeping blindly."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["wait_for"]


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

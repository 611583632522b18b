"""The one bounded retry: a call repeated on the errors that a moment's wait can cure, the last one raised.

For a transient failure with a known cure (a deadlock, a node the metadata still lists): `attempts` calls in all,
`step_s * attempt` seconds apart (a linear back-off: these clear in milliseconds to a second). The loops that never
give up (the stream agents, the drain loop) keep their own shape: they back off exponentially and reconnect.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["retry"]

T = TypeVar("T")


def retry(
    call: Callable[[], T],
    *,
    attempts: int,
    retry_on: tuple[type[BaseException], ...],
    step_s: float,
    on_retry: Callable[[BaseException, int], object] | None = None,
) -> T:
    """`call()`'s result; on a `retry_on` error, `on_retry(error, attempt)` and again after `step_s * attempt`
    seconds, up to `attempts` calls in all (the last one's error is raised). Any other error is raised at once."""
    for attempt in range(1, attempts):
        try:
            return call()
        except retry_on as exc:
            if on_retry is not None:
                on_retry(exc, attempt)
            time.sleep(step_s * attempt)
    return call()

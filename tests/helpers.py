"""Transitional: the names tests/test_recall.py and tests/test_recall_trust.py still import from here.

Everything lives in `tests.support`; import from there. `settings_env(settings)` is
`settings.child_environ()`. This module goes once those two files import `tests.support`.
"""

from __future__ import annotations

from typing import Any

from producers.settings import Settings
from tests.support import Worker, cleanup, publish, wait_caught_up, wait_for

__all__ = ["Worker", "cleanup", "publish", "settings_env", "wait_caught_up", "wait_for"]


def settings_env(settings: Settings, **extra: Any) -> dict[str, str]:
    """The environment of a child process on exactly these settings: `settings.child_environ(**extra)`."""
    return settings.child_environ(**extra)

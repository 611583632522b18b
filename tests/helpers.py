"""Transitional: `settings_env`, still imported by tests/test_recall.py and tests/test_recall_trust.py.

Everything else is `tests.support`. `settings_env(settings, **extra)` is `settings.child_environ(**extra)`
(`producers.settings.Settings`); this module goes once those two files call that.
"""

from __future__ import annotations

from typing import Any

from producers.settings import Settings

__all__ = ["settings_env"]


def settings_env(settings: Settings, **extra: Any) -> dict[str, str]:
    """The environment of a child process on exactly these settings: `settings.child_environ(**extra)`."""
    return settings.child_environ(**extra)

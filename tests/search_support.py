"""Transitional: the names tests/test_recall.py, tests/test_recall_trust.py and tests/test_search.py still
import from here.

Everything lives in `tests.support`; import from there. `Ledger` is `tests.support.RecorderWriter` (it
writes through the PostgreSQL recorder and never touches Kafka); `run` is `asyncio.run`. This module
goes once those files import `tests.support`.
"""

from __future__ import annotations

from asyncio import run

from tests.support import RecorderWriter, async_pool, drain_all, outbox_count, private_store, wait_for

Ledger = RecorderWriter

__all__ = ["Ledger", "async_pool", "drain_all", "outbox_count", "private_store", "run", "wait_for"]

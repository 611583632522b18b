"""Bulkheads: how much of one process one tenant's expensive requests may hold at once.

A request whose work grows with its input or with the tenant's size (the context block's token counting, the
full consistency scan) takes a slot of a `Bulkhead` first: at most `per_tenant` slots of one tenant and `total`
slots in all are held at once in a process, so one tenant's largest requests never take every worker thread,
core or pooled connection from the others.

    async with CONTEXT_SLOTS.slot(tenant): ...       # waits for its turn (the request is answered later)
    async with CONSISTENCY_SLOTS.try_slot(tenant): ...  # or 429 `busy` with Retry-After, at once

The state is per event loop (a process may run several, e.g. tests). CPU work itself runs in a worker thread
(starlette's `run_in_threadpool`), so the event loop keeps serving the other requests meanwhile.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from api.errors import ApiError

__all__ = ["CONSISTENCY_SLOTS", "CONTEXT_SLOTS", "Bulkhead"]


@dataclass
class _State:
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    held: dict[str, int] = field(default_factory=dict)
    total: int = 0


class Bulkhead:
    """At most `per_tenant` holders of one tenant and `total` holders in all, per event loop."""

    def __init__(self, what: str, *, per_tenant: int, total: int, retry_after_s: int = 1) -> None:
        self.what, self.per_tenant, self.total, self.retry_after_s = what, per_tenant, total, retry_after_s
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _State] = weakref.WeakKeyDictionary()

    def _state(self) -> _State:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = self._states[loop] = _State()
        return state

    def _free(self, state: _State, tenant: str) -> bool:
        return state.total < self.total and state.held.get(tenant, 0) < self.per_tenant

    def _take(self, state: _State, tenant: str) -> None:
        state.held[tenant] = state.held.get(tenant, 0) + 1
        state.total += 1

    async def _give(self, state: _State, tenant: str) -> None:
        async with state.changed:
            state.total -= 1
            if state.held[tenant] == 1:
                del state.held[tenant]  # no entry per tenant ever seen: the map holds the current holders only
            else:
                state.held[tenant] -= 1
            state.changed.notify_all()

    @asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        """Hold a slot for `tenant`, waiting until one is free."""
        state = self._state()
        async with state.changed:
            await state.changed.wait_for(lambda: self._free(state, tenant))
            self._take(state, tenant)
        try:
            yield
        finally:
            await asyncio.shield(self._give(state, tenant))

    @asynccontextmanager
    async def try_slot(self, tenant: str) -> AsyncIterator[None]:
        """Hold a slot for `tenant` if one is free now; otherwise 429 `busy` with Retry-After."""
        state = self._state()
        if not self._free(state, tenant):
            mine = state.held.get(tenant, 0) >= self.per_tenant
            why = "this tenant's previous one is still running" if mine else "the server runs as many as it may"
            raise ApiError(
                429,
                "busy",
                f"{self.what}: {why}; retry after {self.retry_after_s} s",
                None,
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self._take(state, tenant)
        try:
            yield
        finally:
            await asyncio.shield(self._give(state, tenant))


# the context block counts up to a few times budget x 4 characters with the tokenizer (a core each)
CONTEXT_SLOTS = Bulkhead("context", per_tenant=1, total=2)
# a full scan of a tenant in PostgreSQL and Elasticsearch (seconds at 100k facts)
CONSISTENCY_SLOTS = Bulkhead("consistency check", per_tenant=1, total=2, retry_after_s=5)

"""Child processes for the CPU work of a large request: `Offload.run(fn, *args)`, `fn` a function of picklable
values whose answer depends on them alone (it may run again in a thread). Imports only the standard library, so a
child starts with this module and the modules it is told to import, not with the API's.

A worker thread of the API process running Python holds the GIL, and the event loop takes the GIL back after every
wait on a socket: each time it waits its turn again, so another tenant's small read, a dozen turns of the loop,
takes about as long as the large request's CPU work. A child process has a GIL of its own.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, TypeVar

__all__ = ["CHILDREN", "Offload"]

log = logging.getLogger(__name__)

T = TypeVar("T")
# children at most (fewer when this process may use fewer cores): each holds ~37 MB, and the answers of the large
# requests they judge are still written by this one process
CHILDREN = 4
_PARENT_CHECK_S = 1.0  # how often a child looks for its parent


class Offload:
    """The children are spawned on the first call (a process that never gets a large request never starts one), at
    most `children`: by default one a core this process may use, and `CHILDREN`. A call is run in a thread instead
    when it cannot be sent (a value nested deeper than pickle goes, which json.loads reads), when its child died (the
    pool is replaced on the next call) and after `close`. A child outlives this process by a second at most, however
    it ends."""

    def __init__(self, modules: tuple[str, ...], children: int | None = None) -> None:
        self._modules = modules  # what the children import as they start: the functions they will be given
        self._children = children or min(len(os.sched_getaffinity(0)), CHILDREN)
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self._children,  # spawned as calls need them, not all at once
                mp_context=get_context("spawn"),  # a fork of a process with threads may copy a lock held
                initializer=_start_child,
                initargs=(self._modules, os.getpid()),
            )
        return self._pool

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            return await asyncio.to_thread(fn, *args)
        pool = self._started()
        try:
            return await asyncio.wrap_future(pool.submit(fn, *args))
        except (RecursionError, pickle.PicklingError):
            return await asyncio.to_thread(fn, *args)
        except BrokenProcessPool as exc:
            log.warning("a child process died or failed to start (%s): a new one starts on the next call", exc)
            if self._pool is pool:
                self._pool = None
                _end_broken(pool)
            return await asyncio.to_thread(fn, *args)

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _end_broken(pool: ProcessPoolExecutor) -> None:
    """A broken pool's surviving children killed, then the pool shut down. A child killed while it held the call
    queue's read lock leaves its siblings waiting on that lock forever; Python 3.11's pool stops them with SIGTERM,
    which they ignore when this process does (an ignored signal passes through exec), and then joins them: its
    manager thread, and this process's exit with it, would never end."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _start_child(modules: tuple[str, ...], parent: int) -> None:
    """A child's start: import what it will run, and exit once `parent` is gone (killed, it never says so: the
    child would wait for calls forever, holding its memory)."""
    for name in modules:
        importlib.import_module(name)

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=orphaned, name="parent-watch", daemon=True).start()

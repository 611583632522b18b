"""The ledger's own processes as children of the test: the projector worker, the search indexer and the embedder.

Each runs exactly as an operator starts it, on the test's private settings (`Settings.child_environ`),
logging to a temporary file: `.start()`, `.alive()`, `.check()` (AssertionError with the log tail if
it exited), `.kill()` (SIGKILL, like a crash), `.stop()` (SIGTERM, then SIGKILL), `.log()`; `frozen(process)`
stops one mid-work (SIGSTOP, like a stuck worker) for the length of a `with`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infra.procs import launch, terminate
from producers.settings import REPO_ROOT, Settings

__all__ = ["Embedder", "Indexer", "Process", "Worker", "frozen"]


class Process:
    """`python <argv>` as a child process with the LEDGER_* variables of `settings` (plus `extra_env`)."""

    name = "process"

    def __init__(self, settings: Settings, argv: list[str], **extra_env: Any) -> None:
        self.settings = settings
        self.argv = argv
        self.env = settings.child_environ(**extra_env)
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")[1])

    def start(self) -> Process:
        # in the test's own process group: a Ctrl-C of the run reaches the children too
        self.proc = launch([sys.executable, *self.argv], self.log_path, self.env, REPO_ROOT, new_session=False)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> None:
        """AssertionError with the tail of the log if the process was started and has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n{self.log()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None:
            terminate(self.proc, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self):
        try:
            return self.start()
        except BaseException:  # a start that timed out or failed leaves no child behind (no __exit__ runs)
            self.kill()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Worker(Process):
    """The projector: `python -m stream_processors` (Kafka -> PostgreSQL)."""

    name = "worker"

    def __init__(self, settings: Settings, **extra_env: Any) -> None:
        super().__init__(settings, ["-m", "stream_processors"], **extra_env)

    def start(self) -> Worker:
        super().start()
        return self


class Indexer(Process):
    """The search indexer: `ledger indexer` (PostgreSQL's search outbox -> Elasticsearch), polling every 0.1 s."""

    name = "indexer"

    def __init__(self, settings: Settings, **extra_env: Any) -> None:
        super().__init__(settings, ["-m", "infra.cli", "indexer"], **{"indexer_poll_s": 0.1, **extra_env})

    def start(self) -> Indexer:
        super().start()
        return self


class Embedder(Process):
    """The embedding stage: `ledger embedder` (embed_queue -> stored vectors -> outbox), polling every 0.1 s."""

    name = "embedder"

    def __init__(self, settings: Settings, **extra_env: Any) -> None:
        super().__init__(settings, ["-m", "infra.cli", "embedder"], **{"embedder_poll_s": 0.1, **extra_env})

    def start(self) -> Embedder:
        super().start()
        return self


@contextmanager
def frozen(process: Process | None) -> Iterator[None]:
    """SIGSTOP the child (it stops mid-work, like a stuck worker), SIGCONT on the way out."""
    assert process is not None and process.proc is not None and process.alive()
    os.kill(process.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.proc.pid, signal.SIGCONT)

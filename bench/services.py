"""Run the ledger's own processes (worker, indexer, API) as subprocesses on private names.

A benchmark or an end-to-end test must measure the processes a deployment runs, not
functions called in-process: each part is started the way an operator starts it
(`ledger worker`, `ledger indexer`, uvicorn on `api.main:app`) with the LEDGER_*
variables of a private Settings (`Settings.child_environ`: topic, schema, index, port, API
keys, every other field too). `stop()` ends exactly the processes this object started.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from infra.private import drop_private, free_port, unique_name
from infra.procs import launch, terminate
from producers.settings import REPO_ROOT, Settings

__all__ = [
    "Services",
    "drop_private",
    "free_port",
    "unique_name",
]  # the names, clean-up and port: infra's, shared with the tests


@dataclass
class Services:
    """Start/stop the workers, the search indexers, the embedders and the API for one Settings; logs go to
    `log_dir`."""

    settings: Settings
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    def _cmd(self, name: str) -> list[str]:
        py = sys.executable
        if name == "worker" or name.startswith("worker-"):  # worker, worker-2, ...: they share the partitions
            return [py, "-m", "infra.cli", "worker", "--loglevel", "warning"]
        if name.startswith("indexer"):  # indexer, indexer-2, ...: any number share the outbox
            return [py, "-m", "infra.cli", "indexer"]
        if name.startswith("embedder"):
            return [py, "-m", "infra.cli", "embedder"]
        if name == "api":
            return [
                py,
                "-m",
                "uvicorn",
                "api.main:app",
                "--host",
                self.settings.api_host,
                "--port",
                str(self.settings.api_port),
                "--log-level",
                "warning",
                "--no-access-log",
            ]
        raise ValueError(f"unknown service {name!r}")

    def start(self, *names: str) -> None:
        env = {**self.settings.child_environ(), "PYTHONUNBUFFERED": "1"}
        for name in names:
            if name in self.procs and self.procs[name].poll() is None:
                continue
            self.procs[name] = launch(self._cmd(name), self.log_dir / f"{name}.log", env, REPO_ROOT)
        if "api" in names:
            self.wait_api()

    def check_alive(self) -> None:
        """Raise if a started process died (with the tail of its log), instead of waiting forever on it."""
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {p.returncode}; log tail:\n{tail}")

    def wait_api(self, timeout: float = 60.0) -> None:
        self.wait_http(f"{self.url}/v1/health", timeout, what=f"API at {self.url}")

    def wait_http(
        self,
        url: str,
        timeout: float,
        *,
        ok: Callable[[httpx.Response], bool] = lambda r: r.status_code < 500,
        every: float = 0.2,
        what: str,
    ) -> None:
        """Poll `url` until `ok(response)`; at once the log of a started process that died (`check_alive`),
        TimeoutError naming `what` after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            try:
                if ok(httpx.get(url, timeout=2)):
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not up after {timeout}s")
            time.sleep(every)

    def stop(self, *names: str, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`, of the named processes (default: all we started)."""
        for name in names or tuple(self.procs):
            p = self.procs.pop(name, None)
            if p is not None:
                terminate(p, timeout, group=True)

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

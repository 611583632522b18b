"""What every multi-node server cluster infra runs on this machine shares (infra.kafka_cluster, infra.es_cluster; and
infra.pg_server's one server): nodes found by their pid files, killed one at a time like a crash, stopped all at once,
their folder removed.

A subclass names each node's ports (`addresses`), its processes (`processes`: the server first, then whatever
started it and exits with it), its log (`log`), how all are configured and started (`launch_all`) and when the cluster
is `healthy`; the rest is here, so both clusters start, stop and clean up the same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, Self, TypeVar

from infra.procs import InfraError, port_open, stop_pid, wait_until

__all__ = ["LocalCluster"]

N = TypeVar("N")


class LocalCluster(Generic[N]):
    """Nodes (`self.nodes`, numbered from 1) under `self.base_dir`; `part` names the cluster in errors."""

    part: str
    base_dir: Path
    nodes: list[N]

    def processes(self, node: N) -> list[tuple[Path, int | None]]:
        """(pid file, running pid or None) of each process of `node`, its server first."""
        raise NotImplementedError

    def addresses(self, node: N) -> list[tuple[str, int]]:
        """(host, port) of each port `node` listens on."""
        raise NotImplementedError

    def log(self, node: N) -> Path:
        """The file that says why `node` did not start."""
        raise NotImplementedError

    def launch_all(self) -> None:
        """Install, configure and start every node, without waiting for them."""
        raise NotImplementedError

    def healthy(self) -> bool:
        """Every node is in the cluster and it serves."""
        raise NotImplementedError

    def start(self, timeout: float = 180.0) -> Self:
        """Start every node at once and wait until the cluster is healthy; a node's process that exits fails it at
        once, and a cluster that does not become healthy is stopped again."""
        for node_id, n in enumerate(self.nodes, start=1):
            for host, port in self.addresses(n):
                if port_open(host, port):  # another server there would answer our probes
                    raise InfraError(self.part, f"port {port} (node {node_id}) is already taken")
        self.launch_all()
        try:
            wait_until(self.healthy, self.part, timeout, self.log(self.nodes[0]), self._all_alive)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_node(self, node_id: int, check: Callable[[], bool], what: str, timeout: float) -> None:
        """Wait until `check()` says node `node_id` is `what` again; fails at once if its process exited."""
        n = self.node(node_id)
        wait_until(check, self.part, timeout, self.log(n), lambda: self.alive(n), what=f"{what} (node {node_id})")

    def alive(self, node: N) -> bool:
        """Its server, or what starts it, runs."""
        return any(pid is not None for _, pid in self.processes(node))

    def _all_alive(self) -> bool:
        return all(self.alive(n) for n in self.nodes)

    def node(self, node_id: int) -> N:
        return self.nodes[node_id - 1]

    def pid(self, node_id: int) -> int | None:
        """The node's server while it runs."""
        return self.processes(self.node(node_id))[0][1]

    def kill(self, node_id: int) -> int:
        """SIGKILL one node's server, like a crash (no shutdown code runs); returns the pid killed."""
        procs = self.processes(self.node(node_id))
        pid = procs[0][1]
        if pid is None:
            raise InfraError(self.part, f"node {node_id} is not running")
        stop_pid(pid, signal.SIGKILL, timeout=30)
        for _, parent in procs[1:]:
            if parent is not None:  # it exits with its server; reaped here (it is our child)
                stop_pid(parent, signal.SIGTERM, timeout=10)
        for pid_file, _ in procs:
            pid_file.unlink(missing_ok=True)
        return pid

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node still running (SIGTERM, SIGKILL after `timeout`), all at once."""
        running = [proc for n in self.nodes for proc in self.processes(n)]
        for _, pid in running:
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGTERM)  # a pid this cluster started (`processes` checks the command line)
                except ProcessLookupError:
                    pass
        for pid_file, pid in running:
            if pid is not None:
                stop_pid(pid, signal.SIGTERM, timeout)
            pid_file.unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the cluster's folder (data, configurations, logs); only once it is stopped."""
        if any(pid is not None for n in self.nodes for _, pid in self.processes(n)):
            raise InfraError(self.part, "remove() of a running cluster")
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self.remove()

    @contextlib.contextmanager
    def running(self, timeout: float = 180.0) -> Iterator[Self]:
        """Started for the block; then stopped without waiting for a clean shutdown (its data is deleted next) and
        removed, with the folder above it when no other cluster is in it. A test's cluster, whatever the test did."""
        try:
            yield self.start(timeout=timeout)
        finally:
            try:
                self.stop(timeout=5)
            finally:
                self.remove()
                with contextlib.suppress(OSError):
                    self.base_dir.parent.rmdir()

"""Start, find and stop the servers infra owns, by pid file, and wait for health.

Each managed process writes a pid file under ``<data_dir>/run``; ``down`` stops
exactly those pids, after checking that the pid still belongs to the command it
started (a recycled pid is never killed). ``launch`` / ``terminate`` are the one way
to start and end a child process, for the benchmarks and the tests too.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import psutil

from projections.search.drain import lower_autogroup


class InfraError(RuntimeError):
    """A part failed to install, start or become healthy; the message says which and why."""

    def __init__(self, part: str, reason: str, log: Path | None = None) -> None:
        self.part, self.reason, self.log = part, reason, log
        where = f" (log: {log})" if log else ""
        super().__init__(f"{part}: {reason}{where}")


def run(cmd: Sequence[str], part: str, log: Path | None = None, **kw) -> subprocess.CompletedProcess:
    """Run a setup command to completion; on failure raise InfraError with its output's tail."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, **kw)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as fh:
            fh.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        # Maven buries the cause under boilerplate: prefer the lines that say what failed
        key = [ln for ln in lines if "Failed to execute" in ln or "Could not" in ln or "not found" in ln.lower()]
        reason = " | ".join((key or lines[-6:])[:3])[:600]
        raise InfraError(part, f"`{' '.join(cmd[:3])} ...` exited {proc.returncode}: {reason}", log)
    return proc


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (a child of ours that exited and is not reaped yet) counts as dead."""
    if pid <= 0:  # to os.kill these name process groups, never one process: a bad pid file must not reach it
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


def cmdline(pid: int) -> str:
    """`pid`'s arguments joined by spaces; "" when it is gone, a zombie, or caught mid-exec (nothing to read yet)."""
    if pid <= 0:
        return ""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def owned_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in the file if that process is alive and its command line contains marker."""
    pid = read_pid(pid_file)
    if pid is None or not pid_alive(pid) or marker not in cmdline(pid):
        return None
    return pid


def launch(
    cmd: Sequence[str],
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    *,
    new_session: bool = True,
    user: str | None = None,
    nice: int = 0,
) -> subprocess.Popen:
    """Start `cmd` with its output appended to `log` and no stdin: the one launcher of infra, the benchmarks and
    the tests. `env` is the child's whole environment (None: ours). `new_session`: its own session and process
    group, so a Ctrl-C of the caller does not reach it and `terminate(group=True)` ends whatever it started too.
    `nice`: the child starts at that lower CPU priority, and with `new_session` its session's autogroup too
    (drain.lower_priority says why both)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=new_session,
            user=user,
            preexec_fn=partial(os.nice, nice) if nice else None,  # before exec: every thread it starts inherits it
        )
        if nice and new_session:
            lower_autogroup(proc.pid, nice)  # from here: the child may have changed its user
        return proc


def terminate(proc: subprocess.Popen, timeout: float, *, group: bool = False) -> None:
    """SIGTERM a child we launched, SIGKILL after `timeout`; `group`: its whole process group (`new_session`)."""
    if proc.poll() is not None:
        return

    def send(sig: int) -> None:
        if group:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:  # the group ended between the poll and the signal
                pass
        else:
            proc.send_signal(sig)

    send(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(10)


def spawn(
    cmd: Sequence[str],
    log: Path,
    pid_file: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> int:
    """Start a long-running server detached from this process (`env` added to ours), output appended to log;
    its pid goes to `pid_file`, so a later `infra down` finds it. It returns once the child's command line reads
    back: Popen returns when exec has begun, and /proc/<pid>/cmdline reads empty until the kernel has set up the new
    program's arguments, so an `owned_pid` at once could disown a process that is ours."""
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    proc = launch(cmd, log, {**os.environ, **(env or {})}, cwd, user=user)
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 5.0
    while not cmdline(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    return proc.pid


def stop_pid(pid: int, sig: int = signal.SIGTERM, timeout: float = 60.0) -> bool:
    """Signal pid and wait for it to exit; SIGKILL after timeout. True if it was running."""
    if not pid_alive(pid):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    for _ in range(50):
        _reap(pid)
        if not pid_alive(pid):
            break
        time.sleep(0.1)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_owned(pid_file: Path, marker: str, sig: int = signal.SIGTERM, timeout: float = 60.0) -> bool:
    """Stop the process named by a pid file (only if it is still ours) and remove the file."""
    running = owned_pid(pid_file, marker)
    stopped = stop_pid(running, sig, timeout) if running else False
    pid_file.unlink(missing_ok=True)
    return stopped


def healthy_or_stopped(
    check: Callable[[], bool],
    part: str,
    timeout: float,
    log: Path | None,
    alive: Callable[[], bool],
    stop: Callable[[], object],
) -> None:
    """Wait for a freshly started server's health; if it never comes, stop it and re-raise."""
    try:
        wait_until(check, part, timeout, log, alive)
    except InfraError:
        stop()
        raise


def already_up(
    part: str,
    pid: Callable[[], int | None],
    healthy: Callable[[], bool],
    address: tuple[str, int],
    timeout: float,
    log: Path | None,
) -> bool:
    """Before starting a server: True if ours already runs (once it is healthy), False if it is to be started;
    InfraError if a process infra did not start holds its port (never start a second one beside it)."""
    if pid():
        wait_until(healthy, part, timeout, log, lambda: pid() is not None)
        return True
    host, port = address
    if port_open(host, port):
        raise InfraError(part, f"port {port} is taken by a process infra did not start")
    return False


def wait_until(
    check: Callable[[], bool],
    part: str,
    timeout: float,
    log: Path | None = None,
    alive: Callable[[], bool] | None = None,
    what: str = "healthy",
) -> None:
    """Poll check() until it is true; fail early if the process died, or at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - any failure of a probe means "not yet"
            pass
        if alive is not None and not alive():
            raise InfraError(part, f"the process exited before it became {what}", log)
        time.sleep(0.5)
    raise InfraError(part, f"not {what} after {timeout:.0f}s", log)


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _reachable_by_others(path: Path) -> bool:
    """Can a non-root user traverse every folder down to path?"""
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.stat().st_mode & 0o001:
            return False
    return True


def service_dir(data_dir: Path, name: str) -> Path:
    """The real folder for a server that runs as its own user (Elasticsearch, PostgreSQL).

    It is `<data_dir>/<name>` when that user can reach it; otherwise (a checkout under
    /root, say) a folder under /var/lib/memory-ledger, linked from the data folder so it
    is still found there. Always returned resolved, so the server never walks the link.
    """
    data_dir = data_dir.resolve()
    link = data_dir / name
    if link.is_symlink() or _reachable_by_others(data_dir):
        return link.resolve()
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    target = Path("/var/lib/memory-ledger") / digest / name
    target.mkdir(parents=True, exist_ok=True)
    for parent in (target.parent, target.parent.parent):
        parent.chmod(0o755)
    data_dir.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)
    return target

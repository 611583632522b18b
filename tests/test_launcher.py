"""`infra.procs.launch` / `terminate` / `spawn`: the one launcher of infra, the benchmarks (bench.services) and the
tests (tests.support.processes), on throwaway `python -c` children (no server)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

from infra.procs import InfraError, already_up, cmdline, launch, pid_alive, read_pid, spawn, terminate

pytestmark = pytest.mark.unit

# prints its environment variable, starts a grandchild in its own process group, says its pid, then waits
PARENT = """
import os, subprocess, sys, time
print("value", os.environ.get("LAUNCH_PROBE"), flush=True)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("grandchild", child.pid, flush=True)
time.sleep(60)
"""
STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def _wait_for(log, text: str) -> str:
    deadline = time.monotonic() + 20
    while text not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return log.read_text()


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_launched_child_gets_exactly_its_env_its_log_and_its_own_group(tmp_path):
    log = tmp_path / "logs" / "parent.log"  # the folder is made
    proc = launch([sys.executable, "-c", PARENT], log, {**os.environ, "LAUNCH_PROBE": "seen"}, tmp_path)
    try:
        text = _wait_for(log, "grandchild")
        assert "value seen" in text
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)  # new_session: a group of its own
        grandchild = int(text.split("grandchild")[1].split()[0])
        terminate(proc, 10, group=True)
        assert proc.returncode is not None and _gone(grandchild)  # the whole group ended
    finally:
        terminate(proc, 1, group=True)


# its CPU priority, what its threads start with, and its session's autogroup
NICE = """
import os, threading
print("nice", os.getpriority(os.PRIO_PROCESS, 0), flush=True)
t = threading.Thread(target=lambda: print("thread", os.getpriority(os.PRIO_PROCESS, 0), flush=True))
t.start(); t.join()
print(open("/proc/self/autogroup").read().strip(), flush=True)
"""


@pytest.mark.parametrize("other_user", [False, True], ids=["as-us", "as-another-user"])
def test_a_child_launched_at_a_lower_priority_starts_there_with_its_threads_and_its_session(tmp_path, other_user):
    """The nice value is set before exec (a JVM's threads inherit it) and its session's autogroup too, also for a
    child that changed its user (the local Elasticsearch): that child cannot set its own autogroup."""
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("no autogroups on this kernel")
    user, python = None, sys.executable
    if other_user:
        if os.geteuid() != 0:
            pytest.skip("starting a child as another user needs root")
        # the system's python, which any user may run (ours may live under root's home): the code needs no package
        user, python = "nobody", shutil.which("python3", path="/usr/bin:/bin")
        if python is None:
            pytest.skip("no system python3 for another user to run")
    log = tmp_path / "nice.log"
    proc = launch([python, "-c", NICE], log, dict(os.environ), Path("/"), user=user, nice=7)
    assert proc.wait(20) == 0, log.read_text()
    text = log.read_text()
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert f"nice {min(mine + 7, 19)}" in text and f"thread {min(mine + 7, 19)}" in text, text
    assert "nice 7" in text.splitlines()[-1], text  # the autogroup line
    # not ours: a process whose session never called setsid (a CI runner's) is in the root group, which reads empty
    ours = open("/proc/self/autogroup").read().split()
    theirs = text.splitlines()[-1].split()
    assert theirs[0].startswith("/autogroup-") and theirs[0] != (ours[0] if ours else None), text


def test_in_the_callers_group_only_the_child_is_signalled(tmp_path):
    log = tmp_path / "child.log"
    proc = launch([sys.executable, "-c", PARENT], log, dict(os.environ), new_session=False)
    grandchild = int(_wait_for(log, "grandchild").split("grandchild")[1].split()[0])
    try:
        assert os.getpgid(proc.pid) == os.getpgid(0)
        terminate(proc, 10)
        assert proc.returncode is not None and pid_alive(grandchild)
    finally:
        os.kill(grandchild, 9)
        _gone(grandchild)


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path):
    log = tmp_path / "stubborn.log"
    proc = launch([sys.executable, "-c", STUBBORN], log)
    _wait_for(log, "ready")
    started = time.monotonic()
    terminate(proc, 0.5, group=True)
    assert proc.returncode == -9 and time.monotonic() - started < 10
    terminate(proc, 0.5, group=True)  # an ended child: nothing to do


def test_spawn_adds_env_to_ours_and_writes_the_pid_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_INHERITED", "kept")
    code = "import os; print(os.environ['LAUNCH_INHERITED'], os.environ['LAUNCH_PROBE'], flush=True)"
    pid = spawn([sys.executable, "-c", code], tmp_path / "s.log", tmp_path / "run" / "s.pid", env={"LAUNCH_PROBE": "x"})
    assert read_pid(tmp_path / "run" / "s.pid") == pid
    assert _wait_for(tmp_path / "s.log", "kept x")
    os.waitpid(pid, 0)


def test_a_server_is_adopted_when_ours_runs_and_never_started_beside_a_strangers(tmp_path):
    """`already_up`, before infra starts Kafka or Elasticsearch: ours running -> wait for its health, start nothing;
    a port held by a process infra did not start -> refuse; else -> start it."""
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        held = stranger.getsockname()
        probes: list[str] = []
        assert already_up("x", lambda: os.getpid(), lambda: probes.append("health") or True, held, 5, None) is True
        assert probes == ["health"]  # ours: adopted once healthy, the port being ours too
        with pytest.raises(InfraError, match=f"port {held[1]} is taken"):
            already_up("x", lambda: None, lambda: True, held, 5, None)
    assert already_up("x", lambda: None, lambda: True, held, 5, None) is False  # free: start it
    with pytest.raises(InfraError, match="not healthy"):
        already_up("x", lambda: os.getpid(), lambda: False, held, 0.1, None)


def test_liveness_and_command_line_of_live_exited_and_impossible_pids(tmp_path):
    """`pid_alive` / `cmdline`, which decide what `infra down` stops: a child that exited but is not reaped yet (a
    zombie) is dead and has no command line; 0 and negative pids (a damaged pid file) are never alive, since to
    os.kill they name process groups."""
    proc = launch([sys.executable, "-c", "import sys; sys.stdin.read()", "probe-marker"], tmp_path / "z.log")
    try:
        assert pid_alive(proc.pid) and "sys.stdin.read() probe-marker" in cmdline(proc.pid)
        os.kill(proc.pid, 9)
        deadline = time.monotonic() + 10
        while pid_alive(proc.pid):  # not reaped: a zombie until proc.wait()
            assert time.monotonic() < deadline, "a killed child still counts as alive"
            time.sleep(0.05)
        assert os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None  # still a zombie
        assert cmdline(proc.pid) == ""
    finally:
        terminate(proc, 1)
    for impossible in (0, -1, -os.getpgid(0)):
        assert pid_alive(impossible) is False and cmdline(impossible) == ""

"""memory-ledger's own processes (stream worker, search indexer, HTTP API, MCP server) run like the servers.

infra only spawns the `ledger` commands by name; it imports none of their code, so
the data flow (producers -> stream_processors -> projections -> api) stays one-way.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from infra.procs import InfraError, owned_pid, spawn, stop_owned, wait_until
from producers.settings import Settings

SERVICES = {
    "worker": ["worker"],
    "indexer": ["indexer"],
    "api": ["serve"],
    "mcp": ["mcp", "--transport", "http"],  # the MCP server over Streamable HTTP, beside the API
}
HEALTH = {  # the services with an HTTP health route: (host, port, path)
    "api": lambda s: (s.api_host, s.api_port, "/v1/health"),
    "mcp": lambda s: (s.mcp_host, s.mcp_port, "/health"),
}


def _ledger() -> str:
    return str(Path(sys.executable).parent / "ledger")


def _pid_file(s: Settings, name: str) -> Path:
    return s.run_dir / f"{name}.pid"


def _log(s: Settings, name: str) -> Path:
    return s.log_dir / f"{name}.log"


def pid(s: Settings, name: str) -> int | None:
    return owned_pid(_pid_file(s, name), " ".join(SERVICES[name]))


def healthy(s: Settings, name: str) -> bool:
    if pid(s, name) is None:
        return False
    if name in HEALTH:
        host, port, path = HEALTH[name](s)
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=3) as resp:
            return resp.status == 200
    return True


def start(s: Settings, name: str, timeout: float = 90.0) -> None:
    if pid(s, name) is None:
        # exactly these settings, whatever the environment of the caller (`Settings.as_env`)
        spawn([_ledger(), *SERVICES[name]], _log(s, name), _pid_file(s, name), env=s.as_env())
    try:
        wait_until(lambda: healthy(s, name), name, timeout, _log(s, name), lambda: pid(s, name) is not None)
    except InfraError:
        stop(s, name)
        raise


def stop(s: Settings, name: str) -> bool:
    return stop_owned(_pid_file(s, name), " ".join(SERVICES[name]), timeout=30)


def describe(s: Settings, name: str) -> dict[str, str]:
    addresses = {"api": f"http://{s.api_host}:{s.api_port}", "mcp": f"http://{s.mcp_host}:{s.mcp_port}/mcp"}
    address = addresses.get(name, f"ledger {' '.join(SERVICES[name])}")
    return {"address": address, "log": str(_log(s, name)), "data": "-"}

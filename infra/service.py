"""memory-ledger's own processes (stream worker, search indexers and embedders, HTTP API, MCP server) run like the
servers. `LEDGER_INDEXERS` / `LEDGER_EMBEDDERS` say how many of those two to run (they share the work);
the k-th gets its own pid file, log and metrics port (the configured port + k - 1).

infra only spawns the `ledger` commands by name; it imports none of their code, so
the data flow (producers -> stream_processors -> projections -> api) stays one-way.

They run sealed unless told otherwise (`service_settings`): personal fields are encrypted before they reach the
Kafka topic, with a local key-encryption key that infra creates once in the data folder (`<data_dir>/kek`, mode
0600, git-ignored). `LEDGER_ENCRYPTION=off` (set explicitly) still publishes clear records; `LEDGER_KEK` or
`LEDGER_KEK_FILE` replaces the local key, as a deployment's secret store does (docs/encryption.md).
"""

from __future__ import annotations

import os
import stat
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

from infra.procs import InfraError, cmdline, owned_pid, pid_alive, read_pid, spawn, stop_owned, wait_until
from producers.keys.kek import new_kek
from producers.keys.signing import new_signing_key
from producers.settings import Settings

SERVICES = {
    "worker": ["worker"],
    "indexer": ["indexer"],
    "embedder": ["embedder"],  # the embedding stage, apart from the indexer
    "api": ["serve"],
    "mcp": ["mcp", "--transport", "http"],  # the MCP server over Streamable HTTP, beside the API
}
HEALTH = {  # the services with an HTTP health route: (host, port, path)
    "api": lambda s: (s.api_host, s.api_port, "/v1/health"),
    "mcp": lambda s: (s.mcp_host, s.mcp_port, "/health"),
}


SCALED = {"indexer": ("indexers", "indexer_metrics_port"), "embedder": ("embedders", "embedder_metrics_port")}
MAX_INSTANCES = 16  # stop looks this far, so lowering the count still stops the extra ones


def instances(s: Settings, name: str, *, every: bool = False) -> list[str]:
    """The instance names of a service: `indexer`, `indexer-2`, ... (`every`: all that may have been started)."""
    n = MAX_INSTANCES if every else getattr(s, SCALED[name][0]) if name in SCALED else 1
    return [name] + [f"{name}-{k}" for k in range(2, n + 1)] if name in SCALED else [name]


def _secret_file(path: Path, make: Callable[[], bytes]) -> Path:
    """`path`, created once with `make()` (mode 0600) and kept 0600 after; an existing key is never replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # O_EXCL: never replace an existing key
    except FileExistsError:
        if stat.S_IMODE(path.stat().st_mode) != 0o600:
            path.chmod(0o600)  # a secret: readable by its owner only, whatever touched it since
        return path
    with os.fdopen(fd, "wb") as f:
        f.write(make())
    return path


def local_kek(s: Settings) -> Path:
    """The local stack's key-encryption key file, `<data_dir>/kek`: created once (mode 0600), kept 0600 after.

    Losing it loses every sealed record's personal fields: it lives beside the data it opens, for development only.
    """
    return _secret_file(s.data_dir / "kek", lambda: (new_kek() + "\n").encode())


def local_chain_key(s: Settings) -> Path:
    """The local stack's chain signing key (Ed25519, PEM), `<data_dir>/chain-key`, made like the KEK's file: the
    worker signs the ledger chain's checkpoints with it (producers.keys.signing); for development only."""
    return _secret_file(s.data_dir / "chain-key", new_signing_key)


def service_settings(s: Settings) -> Settings:
    """The settings the services run with: `s`, sealed by default.

    No KEK configured: the local one (`local_kek`); no chain signing key: the local one (`local_chain_key`).
    `LEDGER_ENCRYPTION` not set: `on`. An explicit
    `LEDGER_ENCRYPTION=off` is kept (records are published clear, sealed ones are still read with the KEK).
    """
    update: dict[str, object] = {}
    if s.kek is None and s.kek_file is None:
        update["kek_file"] = local_kek(s)
    if "encryption" not in s.model_fields_set:
        update["encryption"] = "on"
    if s.chain_key_file is None:
        update["chain_key_file"] = local_chain_key(s)
    return s.model_copy(update=update)


def _env(s: Settings, name: str, instance: str) -> dict[str, str]:
    s = service_settings(s)
    env = s.as_env()
    if name in SCALED and instance != name:
        port_setting = SCALED[name][1]
        port = getattr(s, port_setting)
        env[f"LEDGER_{port_setting.upper()}"] = str(port + int(instance.rsplit("-", 1)[1]) - 1 if port else 0)
    return env


def _ledger() -> str:
    return str(Path(sys.executable).parent / "ledger")


def _pid_file(s: Settings, name: str) -> Path:
    return s.run_dir / f"{name}.pid"


def _log(s: Settings, name: str) -> Path:
    return s.log_dir / f"{name}.log"


def _pid_of(s: Settings, name: str, instance: str) -> int | None:
    return owned_pid(_pid_file(s, instance), " ".join(SERVICES[name]))


def pid(s: Settings, name: str) -> int | None:
    """The first instance's pid (each instance has its own pid file)."""
    return _pid_of(s, name, name)


def healthy(s: Settings, name: str) -> bool:
    if any(_pid_of(s, name, i) is None for i in instances(s, name)):
        return False
    if name in HEALTH:
        host, port, path = HEALTH[name](s)
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=3) as resp:
            return resp.status == 200
    return True


def start(s: Settings, name: str, timeout: float = 90.0) -> None:
    for instance in instances(s, name):
        if _pid_of(s, name, instance) is None:
            # exactly these settings, whatever the environment of the caller (`Settings.as_env`)
            spawn([_ledger(), *SERVICES[name]], _log(s, instance), _pid_file(s, instance), env=_env(s, name, instance))
    try:
        wait_until(lambda: healthy(s, name), name, timeout, _log(s, name), lambda: _alive(s, name))
    except InfraError as exc:
        stop(s, name)
        if _last_seen.get(name):  # what the liveness probe saw
            raise InfraError(name, f"{exc.reason}; {_last_seen[name]}", exc.log) from exc
        raise


_last_seen: dict[str, str] = {}


def _alive(s: Settings, name: str) -> bool:
    """Whether every instance still runs; on no, remember what its pid file and the process said."""
    for instance in instances(s, name):
        if _pid_of(s, name, instance) is None:
            found = read_pid(_pid_file(s, instance))
            alive = found is not None and pid_alive(found)
            if alive and not cmdline(found):  # caught mid-exec: /proc/<pid>/cmdline reads empty for a moment
                continue  # (seen: "alive True, command line ''" on `make demo`); the next probe tells
            _last_seen[name] = (
                f"pid file {_pid_file(s, instance)} held {found}, alive {alive}, command line {cmdline(found)[:160]!r}"
                if found is not None
                else f"no pid in {_pid_file(s, instance)}"
            )
            return False
    return True


def stop(s: Settings, name: str) -> bool:
    stopped = [
        stop_owned(_pid_file(s, i), " ".join(SERVICES[name]), timeout=30) for i in instances(s, name, every=True)
    ]
    return any(stopped)


def describe(s: Settings, name: str) -> dict[str, str]:
    addresses = {"api": f"http://{s.api_host}:{s.api_port}", "mcp": f"http://{s.mcp_host}:{s.mcp_port}/mcp"}
    address = addresses.get(name, f"ledger {' '.join(SERVICES[name])}")
    if name in SCALED:
        address += f" x{len(instances(s, name))}"
    return {"address": address, "log": str(_log(s, name)), "data": "-"}

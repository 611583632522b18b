"""Bring the parts of the stack up, down, and report on them, in dependency order."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from infra import elasticsearch, kafka, model, postgres
from infra.procs import InfraError
from infra.settings import Settings

SERVERS: dict[str, ModuleType] = {"postgres": postgres, "kafka": kafka, "elasticsearch": elasticsearch}


@dataclass
class PartStatus:
    part: str
    managed: bool
    pid: int | None
    healthy: bool
    address: str
    log: str


def _healthy(mod: ModuleType, s: Settings) -> bool:
    try:
        return bool(mod.healthy(s))
    except Exception:  # noqa: BLE001 - a failed probe is "not healthy"
        return False


def up(s: Settings, parts: list[str], report=print) -> None:
    """Start each part (or, if external, check it); on a failure stop what this call started."""
    started: list[str] = []
    try:
        for part in parts:
            if part == "model":
                if part in s.managed:
                    model.install(s)
                if not model.healthy(s):
                    raise InfraError("model", f"no model files in {s.model_dir}")
                report(part, "ready")
                continue
            mod = SERVERS[part]
            if part in s.managed:
                was_running = mod.pid(s) is not None
                mod.start(s)
                if not was_running:
                    started.append(part)
                report(part, "already running" if was_running else "started")
            elif not _healthy(mod, s):
                raise InfraError(part, f"external {part} is not reachable at {mod.describe(s)['address']}")
            else:
                report(part, "external, healthy")
    except BaseException:
        for part in reversed(started):
            SERVERS[part].stop(s)
        raise


def down(s: Settings, parts: list[str]) -> dict[str, bool]:
    """Stop the servers infra started (by pid file); external ones are left alone."""
    result = {}
    for part in reversed(parts):
        if part in SERVERS and part in s.managed:
            result[part] = SERVERS[part].stop(s)
    return result


def status(s: Settings, parts: list[str]) -> list[PartStatus]:
    out = []
    for part in parts:
        mod = model if part == "model" else SERVERS[part]
        desc = mod.describe(s)
        pid = mod.pid(s) if part in SERVERS else None
        out.append(PartStatus(part, part in s.managed, pid, _healthy(mod, s), desc["address"], desc["log"]))
    return out

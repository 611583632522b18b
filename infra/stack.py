"""Bring the parts of the stack up, down, and report on them, in dependency order.

Servers (postgres, kafka, elasticsearch) and the model come first; memory-ledger's
own processes (worker, indexer, embedder, api, mcp) start after them and stop before them.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from infra import elasticsearch, kafka, model, postgres, reranker, service
from infra.procs import InfraError
from producers.settings import Settings

SERVERS: dict[str, ModuleType] = {"postgres": postgres, "kafka": kafka, "elasticsearch": elasticsearch}
SERVER_ORDER = ["postgres", "kafka", "elasticsearch", "model"]
SERVICE_ORDER = ["worker", "indexer", "embedder", "api", "mcp"]  # mcp: the MCP server, beside the API
ALL_PARTS = SERVER_ORDER + SERVICE_ORDER


@dataclass
class PartStatus:
    part: str
    managed: bool
    pid: int | None
    healthy: bool
    address: str
    log: str


def _healthy(part: str, s: Settings) -> bool:
    try:
        if part in SERVICE_ORDER:
            return service.healthy(s, part)
        return bool((model if part == "model" else SERVERS[part]).healthy(s))
    except Exception:  # noqa: BLE001 - a failed probe is "not healthy"
        return False


def _describe(part: str, s: Settings) -> dict[str, str]:
    if part in SERVICE_ORDER:
        return service.describe(s, part)
    return (model if part == "model" else SERVERS[part]).describe(s)


def _pid(part: str, s: Settings) -> int | None:
    if part in SERVICE_ORDER:
        return service.pid(s, part)
    return SERVERS[part].pid(s) if part in SERVERS else None


def up(s: Settings, parts: list[str], report=print) -> None:
    """Start each part (or, if external, check it); on a failure stop what this call started."""
    started: list[str] = []
    try:
        for part in parts:
            if part == "model":
                if part in s.managed:
                    model.install(s)
                    reranker.install(s)  # recall's cross-encoder, beside the embedding model
                if not model.healthy(s):
                    raise InfraError("model", f"no model files in {s.model_dir}")
                if s.rerank_enabled and not reranker.healthy(s):
                    raise InfraError("model", f"no cross-encoder files in {s.rerank_dir}")
                report(part, "ready")
            elif part in SERVICE_ORDER:
                was_running = service.pid(s, part) is not None
                service.start(s, part)
                if not was_running:
                    started.append(part)
                report(part, "already running" if was_running else "started")
            elif part in s.managed:
                mod = SERVERS[part]
                was_running = mod.pid(s) is not None
                mod.start(s)
                if not was_running:
                    started.append(part)
                report(part, "already running" if was_running else "started")
            elif not _healthy(part, s):
                raise InfraError(part, f"external {part} is not reachable at {_describe(part, s)['address']}")
            else:
                report(part, "external, healthy")
    except BaseException:
        for part in reversed(started):
            _stop(part, s)
        raise


def _stop(part: str, s: Settings) -> bool:
    if part in SERVICE_ORDER:
        return service.stop(s, part)
    if part in SERVERS and part in s.managed:
        return SERVERS[part].stop(s)
    return False


def down(s: Settings, parts: list[str]) -> dict[str, bool]:
    """Stop the processes infra started (by pid file), services first; external servers are left alone."""
    return {part: _stop(part, s) for part in reversed(parts) if part != "model"}


def status(s: Settings, parts: list[str]) -> list[PartStatus]:
    return [
        PartStatus(
            part,
            part in s.managed or part in SERVICE_ORDER,
            _pid(part, s),
            _healthy(part, s),
            _describe(part, s)["address"],
            _describe(part, s)["log"],
        )
        for part in parts
    ]

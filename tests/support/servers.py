"""The ledger's servers as children of a test, on free loopback ports and the test's private settings.

- `ApiServer(settings, workers=1)`: `ledger serve --port P [--workers N]` (the HTTP API); `.url`, `.wait_ready()`,
  `.answered(method, route)` (with N > 1: how many requests each process answered, by pid).
- `McpHttpServer(settings)`: `ledger mcp --transport http --port P`; `.url` (the /mcp endpoint), `.wait_ready()`.
- `mcp_stdio(settings, api_key)`: the SDK's StdioServerParameters that spawn `ledger mcp` (stdio) on these settings.
- `tool_body(result)`: what an MCP tool call answered, a result's structured content or an error's body.
- `free_port()`.

Both servers are `tests.support.processes.Process`: `.check()` fails with the log tail if the child died.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from typing import Any

import httpx

from infra.private import free_port
from producers.settings import REPO_ROOT, Settings
from tests.support.processes import Process
from tests.support.waiting import wait_for

__all__ = ["ApiServer", "McpHttpServer", "free_port", "mcp_stdio", "tool_body"]


class _Server(Process):
    health = "/"

    def __init__(self, settings: Settings, argv: list[str], port: int, **extra_env: Any) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        super().__init__(settings, argv, **extra_env)

    def wait_ready(self, timeout: float = 120.0) -> _Server:
        """Until the health route answers 200 (fails at once, with the log, if the server exited)."""

        def up() -> bool:
            self.check()
            try:
                return httpx.get(self.base + self.health, timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, timeout, 0.3, f"the {self.name} server")
        return self

    def __enter__(self):
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise


class ApiServer(_Server):
    """`ledger serve` on a free port; `workers=N` runs N uvicorn processes behind it (`ledger serve --workers N`)."""

    name = "api"
    health = "/v1/health"

    def __init__(self, settings: Settings, *, workers: int = 1, **extra_env: Any) -> None:
        port = free_port()
        argv = ["-m", "infra.cli", "serve", "--port", str(port)] + (["--workers", str(workers)] if workers > 1 else [])
        super().__init__(settings, argv, port, **extra_env)
        self.url = self.base
        self.workers = workers
        # where `ledger serve --workers N` has each process write its samples (api.metrics.prepare_multiprocess)
        self.metrics_dir = settings.data_dir / "metrics" / f"api-{port}"

    def answered(self, method: str, route: str) -> Counter[int]:
        """With several processes: the requests each answered on `route` (a template), by pid, from the samples each
        process writes itself (prometheus-client's multiprocess files, one per pid)."""
        from prometheus_client.multiprocess import MultiProcessCollector

        out: Counter[int] = Counter()
        for path in self.metrics_dir.glob("counter_*.db"):
            for family in MultiProcessCollector.merge([str(path)], accumulate=False):
                for sample in family.samples:
                    if sample.name != "ledger_http_requests_total":
                        continue
                    if (sample.labels["method"], sample.labels["route"]) == (method, route):
                        out[int(path.stem.split("_")[-1])] += int(sample.value)
        return out

    def stop(self, timeout: float = 30.0) -> None:
        super().stop(timeout)
        if self.workers > 1:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)


class McpHttpServer(_Server):
    """`ledger mcp --transport http` on a free port; `.url` is its Streamable HTTP endpoint."""

    name = "mcp"
    health = "/health"

    def __init__(self, settings: Settings, **extra_env: Any) -> None:
        port = free_port()
        argv = ["-m", "infra.cli", "mcp", "--transport", "http", "--port", str(port)]
        super().__init__(settings, argv, port, **extra_env)
        self.url = f"{self.base}/mcp"


def mcp_stdio(settings: Settings, api_key: str | None, **extra_env: Any) -> Any:
    """StdioServerParameters for `ledger mcp` over stdio with exactly these settings (the key as LEDGER_MCP_API_KEY)."""
    from mcp.client.stdio import StdioServerParameters

    env = settings.child_environ(**({"mcp_api_key": api_key} if api_key else {}), **extra_env)
    return StdioServerParameters(command=sys.executable, args=["-m", "infra.cli", "mcp"], env=env, cwd=REPO_ROOT)


def call_tool(url: str, key: str, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """One call of `tool` on the MCP server at `url` (Streamable HTTP, `key` as the bearer), in a session of its own:
    (is_error, tool_body)."""
    import asyncio

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def call() -> tuple[bool, dict[str, Any]]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                result = await client.call_tool(tool, arguments)
        return bool(result.is_error), tool_body(result)

    return asyncio.run(call())


def tool_body(result: Any) -> dict[str, Any]:
    """What an MCP tool call answered: a result's structured content, or the error body a tool error's text carries
    (an error has no structured content: api.mcp.tools.error_result)."""
    if result.is_error:
        assert result.structured_content is None, result.structured_content
        return json.loads(result.content[0].text) if result.content else {}
    return result.structured_content or {}

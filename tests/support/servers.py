"""The ledger's servers as children of a test, on free loopback ports and the test's private settings.

- `ApiServer(settings)`: `ledger serve --port P` (the HTTP API); `.url`, `.wait_ready()`.
- `McpHttpServer(settings)`: `ledger mcp --transport http --port P`; `.url` (the /mcp endpoint), `.wait_ready()`.
- `mcp_stdio(settings, api_key)`: the SDK's StdioServerParameters that spawn `ledger mcp` (stdio) on these settings.
- `free_port()`.

Both servers are `tests.support.processes.Process`: `.check()` fails with the log tail if the child died.
"""

from __future__ import annotations

import sys
from typing import Any

import httpx

from infra.private import free_port
from producers.settings import REPO_ROOT, Settings
from tests.support.processes import Process
from tests.support.waiting import wait_for

__all__ = ["ApiServer", "McpHttpServer", "free_port", "mcp_stdio"]


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
    """`ledger serve` on a free port."""

    name = "api"
    health = "/v1/health"

    def __init__(self, settings: Settings, **extra_env: Any) -> None:
        port = free_port()
        super().__init__(settings, ["-m", "api.cli", "serve", "--port", str(port)], port, **extra_env)
        self.url = self.base


class McpHttpServer(_Server):
    """`ledger mcp --transport http` on a free port; `.url` is its Streamable HTTP endpoint."""

    name = "mcp"
    health = "/health"

    def __init__(self, settings: Settings, **extra_env: Any) -> None:
        port = free_port()
        argv = ["-m", "api.cli", "mcp", "--transport", "http", "--port", str(port)]
        super().__init__(settings, argv, port, **extra_env)
        self.url = f"{self.base}/mcp"


def mcp_stdio(settings: Settings, api_key: str | None, **extra_env: Any) -> Any:
    """StdioServerParameters for `ledger mcp` over stdio with exactly these settings (the key as LEDGER_MCP_API_KEY)."""
    from mcp.client.stdio import StdioServerParameters

    env = settings.child_environ(**({"mcp_api_key": api_key} if api_key else {}), **extra_env)
    return StdioServerParameters(command=sys.executable, args=["-m", "api.cli", "mcp"], env=env, cwd=REPO_ROOT)

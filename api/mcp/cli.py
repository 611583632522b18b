"""`ledger mcp`: the MCP server over stdio (for a client that spawns it) or Streamable HTTP (beside the API).

    ledger mcp                                   # stdio; acts with LEDGER_MCP_API_KEY (or --api-key)
    ledger mcp --transport http                  # http://LEDGER_MCP_HOST:LEDGER_MCP_PORT/mcp, bearer = an API key

Only typer is imported at module level (the `ledger` command line stays fast); api.mcp.server loads the SDK.
Over stdio, stdout is the protocol: every log line goes to stderr (producers.logs).
"""

from __future__ import annotations

import sys

import typer

__all__ = ["mcp"]


def mcp(
    transport: str = typer.Option("stdio", help="stdio (spawned by the client) or http (Streamable HTTP, stateless)"),
    api_key: str | None = typer.Option(
        None, help="stdio: the API key every call acts with (default LEDGER_MCP_API_KEY)"
    ),
    host: str | None = typer.Option(None, help="http: bind address (default LEDGER_MCP_HOST)"),
    port: int | None = typer.Option(None, min=0, max=65535, help="http: port (default LEDGER_MCP_PORT)"),
) -> None:
    """Run the MCP server (its tools, for agents and for operators: docs/mcp.md)."""
    from producers.logs import configure_logging, logging_config
    from producers.settings import get_settings

    s = get_settings()
    if host is not None or port is not None:
        s = s.model_copy(update={"mcp_host": host or s.mcp_host, "mcp_port": port or s.mcp_port})
    configure_logging(s, "mcp")
    if transport == "stdio":
        from api.deps import tenants_for_key
        from api.errors import ApiError
        from api.mcp.auth import STDIO_KEY
        from api.mcp.server import build_server, run_stdio

        key = api_key or s.mcp_api_key
        try:
            tenants_for_key(s, key, STDIO_KEY)
        except ApiError as exc:
            print(
                f"ledger mcp: {exc.message}: set LEDGER_MCP_API_KEY or --api-key to a key of LEDGER_API_KEYS",
                file=sys.stderr,
            )
            raise typer.Exit(2) from None
        run_stdio(build_server(s, stdio_key=key))
    elif transport == "http":
        import uvicorn

        from api.mcp.server import http_app

        uvicorn.run(
            http_app(s),
            host=s.mcp_host,
            port=s.mcp_port,
            log_config=logging_config(s, "mcp"),
            log_level=s.log_level.lower(),
        )
    else:
        print(f"ledger mcp: --transport {transport!r}: stdio or http", file=sys.stderr)
        raise typer.Exit(2)

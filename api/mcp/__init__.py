"""The MCP server (`ledger mcp`): the ledger's tools for agents, over stdio and Streamable HTTP (stateless).

Built on the official SDK (`mcp` 2.x, `MCPServer`). Every tool runs the code the HTTP routes run
(api.reads, api.writes) on a `Resources` the server opens for its process, validates its arguments
with the routes' request models (api.requests: a bad argument is a tool error naming the field, in
the one error shape), and takes its tenants from the caller's API key exactly as the API does
(api.deps.tenants_for_key, check_tenant).

- `tools`: the tools (name, one-line description, input schema, annotations, what each runs).
- `auth`: the API key as a bearer token (HTTP) or the process's key (stdio), and the tenant of a call.
- `server`: `build_server(settings, stdio_key=...)` and the HTTP app (`http_app`).
- `cli`: the `ledger mcp` command (imports only typer at module level).

This package imports nothing from the SDK at import time of `api.mcp` itself, so `ledger --help` stays fast.
"""

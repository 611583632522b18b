"""The service's front ends: the HTTP API (api/main.py), the MCP server and the audit console.

- `main`, `routes`, `deps`, `errors`, `requests`, `schemas`, `request_id`, `limits`, `metrics`: the HTTP app.
- `reads`, `writes` (its events judged by `judging`), `context`, `access`, `tokens`, `receipts`, `dead_letters`:
  what the routes and the MCP tools run. `consistency`: a read given a write's token waits until it has that write.
- `resources`: what the API holds open. `mcp`: the MCP server. `console`, `docs_ui`: `/console` and `/docs`.
- `client`: the read client of the HTTP API. `demo`: `ledger demo` (the `ledger` root is infra/cli.py).
"""

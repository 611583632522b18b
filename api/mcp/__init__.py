"""The MCP server (`ledger mcp`): the ledger's tools for agents, over stdio and Streamable HTTP (stateless).

Every tool runs the code the HTTP routes run, with their request models and tenancy, so both front ends answer
alike. Modules: `tools`, `auth` (the API key as bearer or the process's key), `server` (`build_server`,
`http_app`) and `cli` (`ledger mcp`). Nothing here imports the SDK at import time, so `ledger --help` stays fast.
"""

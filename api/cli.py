"""`ledger`: the command line (publish, topics, worker, rebuild, indexer, embedder, reindex, serve, mcp, demo, keys).

Each sub-command lives beside the code it drives and is only registered here. Settings that do not load (the
development key without LEDGER_DEVELOPMENT, a variable that does not parse) end any of them the same way: one
line on stderr naming the variable (`producers.settings.settings_problem`) and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import typer


class _Ledger(typer.Typer):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            from producers.settings import settings_problem

            problem = settings_problem(exc)
            if problem is None:
                raise
            print(f"ledger: the settings do not load: {problem}", file=sys.stderr)
            raise SystemExit(2) from None


app = _Ledger(add_completion=False, no_args_is_help=True, help="memory-ledger command line")


@app.command()
def serve(
    host: str | None = typer.Option(None, help="bind address (default: LEDGER_API_HOST)"),
    port: int | None = typer.Option(None, help="port (default: LEDGER_API_PORT)"),
    workers: int = typer.Option(1, help="uvicorn worker processes"),
) -> None:
    """Run the HTTP API."""
    import uvicorn

    from producers.logs import configure_logging, logging_config
    from producers.settings import get_settings

    s = get_settings()
    configure_logging(s, "api")
    if workers > 1:  # one /metrics for all of uvicorn's processes (prometheus-client multiprocess mode)
        from api.metrics import prepare_multiprocess

        prepare_multiprocess(s.data_dir / "metrics" / f"api-{port or s.api_port}")
    # uvicorn's loggers through the same configuration, in each of its worker processes too
    uvicorn.run(
        "api.main:app",
        host=host or s.api_host,
        port=port or s.api_port,
        workers=workers,
        log_config=logging_config(s, "api"),
        log_level=s.log_level.lower(),
    )


@app.command()
def demo(
    url: str | None = typer.Option(None, help="base URL of a running service (default: LEDGER_API_HOST/PORT)"),
    api_key: str = typer.Option("dev-key", help="an API key bound to the tenant"),
    tenant: str = typer.Option("demo", help="tenant to write the demo facts into"),
) -> None:
    """Publish bilingual facts, update one, show its history and recall with explanations."""
    from api.demo import run

    run(url, api_key, tenant)


# the write path's commands live in producers/cli.py (imports only typer at module level)
from producers.cli import publish, schema, topics  # noqa: E402

app.command()(publish)
app.command()(topics)
app.command()(schema)  # the event contract as a JSON Schema (producers in other languages)

# the projector's commands live in stream_processors/cli.py (imports only typer at module level)
from stream_processors.cli import rebuild, worker  # noqa: E402

app.command()(worker)
app.command()(rebuild)

# the search projection's commands live in projections/search/cli.py (imports only typer at module level)
from projections.search.cli import embedder, indexer, reindex  # noqa: E402

app.command()(indexer)
app.command()(embedder)
app.command()(reindex)

# the MCP server's command lives in api/mcp/cli.py (imports only typer at module level)
from api.mcp.cli import mcp  # noqa: E402

app.command()(mcp)

# the key-encryption keys' commands (issue 13) live in producers/keys/cli.py (imports only typer at module level)
from producers.keys.cli import keys_app  # noqa: E402

app.add_typer(keys_app, name="keys")


if __name__ == "__main__":
    app()

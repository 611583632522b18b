"""The stack's command line: `python -m infra up|down|status [PART ...]`.

`up` installs what is missing (Kafka jars, the Elasticsearch zip, Debian's
PostgreSQL, the embedding model), starts each server, waits for its health and
prints where it runs and logs. Each command is idempotent.
"""

from __future__ import annotations

import os

os.environ.setdefault("LEDGER_DEVELOPMENT", "1")  # infra runs the development stack (producers.settings)

import sys
import time

import typer
from rich.console import Console
from rich.table import Table

from infra import stack
from infra.procs import InfraError
from producers.settings import get_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(width=200)


def _parts(parts: list[str] | None, default: list[str]) -> list[str]:
    chosen = parts or default
    unknown = [p for p in chosen if p not in stack.ALL_PARTS]
    if unknown:
        raise typer.BadParameter(f"unknown part(s) {unknown}; choose from {stack.ALL_PARTS}")
    return [p for p in stack.ALL_PARTS if p in chosen]


def _table(statuses: list[stack.PartStatus]) -> Table:
    table = Table("part", "state", "pid", "address", "log")
    for st in statuses:
        state = "[green]healthy[/]" if st.healthy else "[red]down[/]"
        if not st.managed:
            state += " (external)"
        table.add_row(st.part, state, str(st.pid or "-"), st.address, st.log)
    return table


@app.command()
def up(
    parts: list[str] = typer.Argument(None, help="parts to start (default: the servers and the model)"),
    service: bool = typer.Option(False, "--service", help="also start the worker, the indexer, the API and MCP"),
) -> None:
    """Install and start the stack, wait until every part is healthy."""
    s = get_settings()
    chosen = _parts(parts, stack.SERVER_ORDER + (stack.SERVICE_ORDER if service else []))
    t0 = time.monotonic()
    try:
        stack.up(s, chosen, report=lambda part, what: console.print(f"[bold]{part}[/]: {what}"))
    except InfraError as exc:
        console.print(f"[red]FAILED[/] {exc}")
        sys.exit(1)
    console.print(_table(stack.status(s, chosen)))
    console.print(f"stack up in {time.monotonic() - t0:.1f}s")


@app.command()
def down(parts: list[str] = typer.Argument(None, help="parts to stop (default: all)")) -> None:
    """Stop exactly the processes `up` started, by pid (services first)."""
    s = get_settings()
    for part, stopped in stack.down(s, _parts(parts, stack.ALL_PARTS)).items():
        console.print(f"[bold]{part}[/]: {'stopped' if stopped else 'was not running'}")


@app.command()
def status(parts: list[str] = typer.Argument(None, help="parts to show (default: all)")) -> None:
    """Say what runs, where, and where it logs; exit 3 when a server (or a part named) is down."""
    statuses = stack.status(get_settings(), _parts(parts, stack.ALL_PARTS))
    console.print(_table(statuses))
    required = set(parts or stack.SERVER_ORDER)
    if not all(st.healthy for st in statuses if st.part in required):
        sys.exit(3)


if __name__ == "__main__":
    app()

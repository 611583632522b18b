"""`ledger indexer`, `ledger embedder`, `ledger reindex` (registered in infra/cli.py; only typer imported at once)."""

from __future__ import annotations

import typer


def indexer(
    poll: float | None = typer.Option(
        None, min=0.001, max=3600, help="longest wait for work, if no NOTIFY (LEDGER_INDEXER_POLL_S)"
    ),
    batch_size: int | None = typer.Option(None, min=1, help="outbox rows per bulk request (LEDGER_INDEXER_BATCH_SIZE)"),
) -> None:
    """Drain the search outbox into Elasticsearch forever (run as many as you like: they share the outbox)."""
    from producers.logs import configure_logging
    from producers.settings import get_settings
    from projections.search.indexer import run_indexer

    settings = get_settings()
    configure_logging(settings, "indexer")
    run_indexer(settings, poll_seconds=poll, batch_size=batch_size)


def embedder(
    poll: float | None = typer.Option(
        None, min=0.001, max=3600, help="longest wait for work, if no NOTIFY (LEDGER_EMBEDDER_POLL_S)"
    ),
    batch_size: int | None = typer.Option(None, min=1, help="versions per claim (LEDGER_EMBEDDER_BATCH_SIZE)"),
) -> None:
    """Embed the versions whose documents lack vectors, forever (run as many as you like: they share the queue)."""
    from producers.logs import configure_logging
    from producers.settings import get_settings
    from projections.search.embedder import run_embedder

    settings = get_settings()
    configure_logging(settings, "embedder")
    run_embedder(settings, poll_seconds=poll, batch_size=batch_size)


def reindex(
    batch_size: int = typer.Option(256, min=1, help="documents per bulk request (and per embedding batch)"),
    embed: bool = typer.Option(
        True, help="embed versions without a stored vector of the configured models now (--no-embed: queue them)"
    ),
) -> None:
    """Reindex: fill a new physical index from PostgreSQL (every version, with its stored vectors), then switch the
    alias to it. Vectors of a switched model are computed now (or, with --no-embed, by the embedders afterwards)."""
    import time

    import psycopg
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from producers.logs import configure_logging
    from producers.settings import get_settings
    from projections.embedding import load_embedder
    from projections.search.client import es_client
    from projections.search.reindex import reindex as run

    s = get_settings()
    configure_logging(s, "reindex")
    with (
        psycopg.connect(s.pg_dsn, autocommit=True, connect_timeout=s.pg_connect_timeout_s) as conn,
        es_client(s, request_timeout=60) as es,
        Progress(
            TextColumn("reindex"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} docs/s"),
            TimeElapsedColumn(),
        ) as bar,
    ):
        embedder = load_embedder(s) if embed else None  # after connecting: a store that is away is said at once
        task = bar.add_task("reindex", total=None, rate="-")
        t0 = time.monotonic()

        def progress(done: int, total: int) -> None:
            elapsed = time.monotonic() - t0
            bar.update(task, completed=done, total=total, rate=f"{done / elapsed:.0f}" if elapsed else "-")

        report = run(s, conn, es, embedder, batch_size=batch_size, progress=progress)
    typer.echo(
        f"alias {s.es_index} -> {report['index']}: {report['documents']} documents in {report['seconds']}s "
        f"({report['docs_per_s']} docs/s); removed {', '.join(report['replaced']) or 'nothing'}"
    )

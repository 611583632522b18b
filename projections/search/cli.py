"""`ledger indexer` and `ledger reindex` (registered in api/cli.py; only typer is imported at module level)."""

from __future__ import annotations

import typer


def indexer(
    poll: float | None = typer.Option(None, help="seconds between polls of an empty outbox (LEDGER_INDEXER_POLL_S)"),
    batch_size: int | None = typer.Option(None, help="outbox rows per bulk request (LEDGER_INDEXER_BATCH_SIZE)"),
) -> None:
    """Drain the search outbox into Elasticsearch forever (one per schema; extra ones wait on a lock)."""
    from producers.logs import configure_logging
    from producers.settings import get_settings
    from projections.search.indexer import run_indexer

    settings = get_settings()
    configure_logging(settings, "indexer")
    run_indexer(settings, poll_seconds=poll, batch_size=batch_size)


def reindex(batch_size: int = typer.Option(256, help="documents per embedding batch")) -> None:
    """Reindex: fill a new physical index from PostgreSQL (every version), then switch the alias to it."""
    import time

    import psycopg
    from elasticsearch import Elasticsearch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from producers.logs import configure_logging
    from producers.settings import get_settings
    from projections.embedding import load_embedder
    from projections.search.reindex import reindex as run

    s = get_settings()
    configure_logging(s, "reindex")
    embedder = load_embedder(s)
    with (
        psycopg.connect(s.pg_dsn, autocommit=True) as conn,
        Elasticsearch(s.es_url, request_timeout=60) as es,
        Progress(
            TextColumn("reindex"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} docs/s"),
            TimeElapsedColumn(),
        ) as bar,
    ):
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

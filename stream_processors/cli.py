"""`ledger worker` and `ledger rebuild` (registered in api/cli.py; only typer is imported at module level)."""

from __future__ import annotations

import typer


def worker(
    loglevel: str | None = typer.Option(None, "--loglevel", "-l", help="log level (default: LEDGER_LOG_LEVEL)"),
) -> None:
    """Run one projector worker (Kafka ledger -> PostgreSQL); start several to share the partitions."""
    from stream_processors.worker import run

    run(loglevel=loglevel)


def rebuild(
    keep_old: bool = typer.Option(True, help="keep the replaced schema as <schema>_old_<ts> (else drop it)"),
    batch_size: int = typer.Option(2000, help="records per transaction"),
) -> None:
    """Replay the ledger from offset 0 into a fresh schema, switch over, and compare checksums."""
    from producers.logs import configure_logging
    from producers.settings import get_settings
    from stream_processors.rebuild import rebuild_with_progress

    settings = get_settings()
    configure_logging(settings, "rebuild")
    report = rebuild_with_progress(settings, keep_old=keep_old, batch_size=batch_size)
    if report.live_checksum != report.rebuilt_checksum:
        raise typer.Exit(1)

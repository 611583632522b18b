"""`ledger worker`, `ledger rebuild` and `ledger verify` (registered in infra/cli.py; only typer is imported at module
level)."""

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
    batch_size: int = typer.Option(2000, min=1, help="records per transaction"),
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


def verify(
    as_json: bool = typer.Option(False, "--json", help="the report as one JSON object on stdout"),
) -> None:
    """Re-read the ledger from offset 0: check the chain, its signed checkpoints and the projection's rows against
    the records; exit 1 naming the first divergence's partition and offset, 0 when intact."""
    from producers.keys.signing import SigningKeyError
    from producers.logs import configure_logging
    from producers.settings import get_settings
    from stream_processors.verify import render
    from stream_processors.verify import verify as run

    settings = get_settings()
    configure_logging(settings, "verify")
    try:
        report = run(settings)
    except SigningKeyError as exc:  # a chain key that is configured and unusable: a configuration error, no verdict
        typer.echo(f"ledger: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        import orjson

        typer.echo(orjson.dumps(report.as_json()).decode())
    else:
        typer.echo(render(report))
    if not report.intact:
        raise typer.Exit(1)

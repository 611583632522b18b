"""`ledger keys new-kek | status | rotate`: the operator's side of the key-encryption keys.

`status` checks the KEKs against the key store as a worker would at start; `rotate` rewraps every live data key
under the active KEK without touching the log. Errors are one line on stderr and a non-zero exit (1: the KEKs,
2: the store or the settings, 3: the store unreachable). Only typer is imported at module level, so
`ledger --help` stays fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import typer

__all__ = ["StoreSummary", "keys_app", "store_summary"]

keys_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="key-encryption keys: make one, check them against the key store, rotate",
)


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@contextmanager
def _errors() -> Iterator[None]:
    """KekError -> exit 1, a failing store -> exit 2 (an unreachable one: exit 3, infra.cli); one line each."""
    import psycopg

    from producers.keys.kek import KekError

    try:
        yield
    except KekError as exc:
        raise _fail(str(exc), 1) from None
    except psycopg.OperationalError:
        raise  # an unreachable store: `ledger` names it and its address in one line (exit 3, infra.cli)
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise _fail(f"the key store answered {type(exc).__name__}: {first}", 2) from None


def _settings() -> Any:
    from producers.settings import get_settings

    return get_settings()  # settings that do not load: `ledger` says which variable, in one line (exit 2)


def _keks(settings: Any) -> Any:
    from producers.keys.store import settings_keks

    return settings_keks(settings)


def _connect(settings: Any) -> Any:
    import psycopg

    return psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=settings.pg_connect_timeout_s)


@dataclass
class StoreSummary:
    """What the key store holds, by state (no key bytes): live keys per KEK id, retired, destroyed, erasures."""

    exists: bool
    live_by_kek: dict[str, int] = field(default_factory=dict)
    retired: int = 0  # live keys no longer handed out (their subject's erasure is on its way)
    destroyed: int = 0
    erasures: int = 0
    erasures_search_pending: int = 0  # erasure records whose search documents the indexer has not yet deleted

    @property
    def live(self) -> int:
        return sum(self.live_by_kek.values())


def store_summary(conn: Any, schema: str) -> StoreSummary:
    """Counts from the key store `schema` (read only; a store no process created yet is `exists=False`)."""
    from psycopg import sql

    def t(table: str) -> Any:
        return sql.Identifier(schema, table)

    row = conn.execute("SELECT to_regclass(%s), to_regclass(%s)", (f'"{schema}".data_keys', f'"{schema}".erasures'))
    keys_table, erasures_table = row.fetchone()
    if keys_table is None:
        return StoreSummary(exists=False)
    out = StoreSummary(exists=True)
    out.live_by_kek = dict(
        conn.execute(
            sql.SQL(
                "SELECT kek_id, count(*) FROM {} WHERE destroyed_at IS NULL GROUP BY kek_id ORDER BY kek_id"
            ).format(t("data_keys"))
        ).fetchall()
    )
    out.retired, out.destroyed = conn.execute(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE destroyed_at IS NULL AND retired_at IS NOT NULL), "
            "count(*) FILTER (WHERE destroyed_at IS NOT NULL) FROM {}"
        ).format(t("data_keys"))
    ).fetchone()
    if erasures_table is not None:
        out.erasures, out.erasures_search_pending = conn.execute(
            sql.SQL("SELECT count(*), count(*) FILTER (WHERE search_purged_at IS NULL) FROM {}").format(t("erasures"))
        ).fetchone()
    return out


@keys_app.command("new-kek")
def new_kek_command(
    kek_id: str | None = typer.Option(
        None, "--id", help='print the JSON ring form {"active": ID, "keys": {ID: key}} instead of the bare key'
    ),
) -> None:
    """Print a fresh random key-encryption key (base64, 32 bytes) and how to configure it."""
    import orjson

    from producers.keys.kek import new_kek

    key = new_kek()
    if kek_id is None:
        typer.echo(key)
        typer.echo(
            "configure it as LEDGER_KEK=<key> (its id is 'default') or write it to a file named by LEDGER_KEK_FILE; "
            "to rotate later, use the JSON form (--id) and `ledger keys rotate`",
            err=True,
        )
        return
    if not kek_id.strip() or kek_id != kek_id.strip():
        raise _fail("--id must be a non-empty name without surrounding spaces")
    typer.echo(orjson.dumps({"active": kek_id, "keys": {kek_id: key}}).decode())
    typer.echo(
        "configure it as LEDGER_KEK or in the file LEDGER_KEK_FILE names; to rotate, add this id and key to the "
        'existing "keys", make it "active" for every process, then run `ledger keys rotate`',
        err=True,
    )


@keys_app.command("status")
def status_command() -> None:
    """The configured KEK ids (never the keys), what the key store holds, and whether the KEKs fit it."""
    from producers.keys.store import check_store

    settings = _settings()
    schema = settings.keys_schema
    with _errors():
        keks = _keks(settings)
        typer.echo(f"encryption: {settings.encryption}")
        if keks is None:
            typer.echo("key-encryption keys: none configured (LEDGER_KEK / LEDGER_KEK_FILE)")
        else:
            others = sorted(keks.ids() - {keks.active_id})
            typer.echo(f"key-encryption keys: active {keks.active_id!r}" + (f", also {others}" if others else ""))
        with _connect(settings) as conn:
            summary = store_summary(conn, schema)
            if not summary.exists:  # a status never creates the store: the first worker or producer does
                typer.echo(f"key store: schema {schema!r} not created yet (no worker or producer used it)")
                typer.echo("check: nothing to check yet")
                return
            by_kek = ", ".join(f"{k!r}: {n}" for k, n in summary.live_by_kek.items()) or "none"
            typer.echo(f"key store: schema {schema!r}")
            typer.echo(f"  live data keys: {summary.live} (by key-encryption key: {by_kek})")
            typer.echo(f"  retired (erasure on its way): {summary.retired}")
            typer.echo(f"  destroyed: {summary.destroyed}")
            typer.echo(
                f"  erasure records: {summary.erasures} "
                f"({summary.erasures_search_pending} waiting for the search index)"
            )
            check_store(conn, schema, keks)  # KekError -> exit 1, exactly what would stop a worker at start
    if keks is None:
        typer.echo("check: no key-encryption key configured, and the store holds no live data key that needs one")
    else:
        typer.echo("check: the configured key-encryption keys fit the key store")


@keys_app.command("rotate")
def rotate_command(
    batch_size: int = typer.Option(500, min=1, help="data keys rewrapped per transaction"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Rewrap every live data key and digest key under the active KEK (the log is not rewritten)."""
    from psycopg import sql
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from producers.keys.store import check_store, rotate

    settings = _settings()
    schema = settings.keys_schema
    with _errors():
        keks = _keks(settings)
        if keks is None:
            raise _fail("no key-encryption key is configured (LEDGER_KEK / LEDGER_KEK_FILE): nothing to rotate to")
        with _connect(settings) as conn:
            check_store(conn, schema, keks)  # every KEK that wraps a live key is configured and right, or stop here
            todo = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE destroyed_at IS NULL AND kek_id <> %s").format(
                    sql.Identifier(schema, "data_keys")
                ),
                (keks.active_id,),
            ).fetchone()[0]
            progress = Progress(
                TextColumn(f"[bold]rewrapping under {keks.active_id!r}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                disable=quiet,
            )
            with progress:
                task = progress.add_task("rotate", total=todo or None)
                done = rotate(conn, schema, keks, batch=batch_size, progress=lambda n: progress.advance(task, n))
            live = check_store(conn, schema, keks)
    typer.echo(f"rewrapped {done} data keys under {keks.active_id!r}")
    unused = sorted(k for k in keks.ids() - {keks.active_id} if not live.get(k))
    still = {k: n for k, n in live.items() if k != keks.active_id}
    if unused:
        typer.echo(
            f"wrap no live data key now (may leave the configuration): {', '.join(unused)} "
            f"(once every process runs with {keks.active_id!r} active; `ledger keys status` checks)"
        )
    if still:  # created under an old active id meanwhile: a producer still runs with the old configuration
        typer.echo(
            "still wrap live data keys (a process still has an older active id? rotate again after updating it): "
            + ", ".join(f"{k} ({n})" for k, n in sorted(still.items()))
        )
    if not unused and not still:
        typer.echo(f"every live data key is wrapped by {keks.active_id!r}")

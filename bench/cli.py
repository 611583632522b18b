"""`python -m bench eval` (only typer is imported at module level, so `--help` stays fast)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

__all__ = ["eval_command"]


def eval_command(
    url: str | None = typer.Option(None, help="base URL of the running API (default: LEDGER_API_HOST/PORT)"),
    api_key: str = typer.Option("dev-key", help="an API key bound to the tenant"),
    tenant: str = typer.Option("bench", help="tenant to evaluate"),
    load: int = typer.Option(0, help="first publish a bench dataset of this many events and wait for catch-up"),
    subjects: int = typer.Option(0, help="subjects of the loaded dataset (default: events / 10)"),
    sample: int = typer.Option(200, help="stored memories sampled for self-retrieval"),
    seed: int = typer.Option(13, help="sampling seed"),
    out: Path | None = typer.Option(None, help="JSON output (default: bench/results/eval-<UTC>.json)"),
    timeout: float = typer.Option(1800, help="seconds to wait for catch-up after --load"),
) -> None:
    """Storage (L2) and retrieval (L3) quality of a running service, as a table and JSON.

    L3 asks the API at --url (POST /v1/recall); L2 reads PostgreSQL and Elasticsearch with the
    LEDGER_* settings, which must name the same schema and index the API serves. Exit 1 when the
    double-active or the orphan rate is not 0.
    """
    import orjson

    from bench.eval import print_table, run_eval
    from producers.settings import REPO_ROOT, get_settings

    s = get_settings()
    url = url or f"http://{s.api_host}:{s.api_port}"
    if load:
        from bench.loader import load_dataset

        info = load_dataset(s, load, subjects or max(1, load // 10), tenant=tenant, timeout=timeout)
        typer.echo(f"loaded {info['events']:,} events; caught up after {info['es_caught_up_s']:.1f}s")
    result = run_eval(s, url, api_key, tenant, sample=sample, seed=seed)
    print_table(result)
    path = out or REPO_ROOT / "bench" / "results" / f"eval-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    typer.echo(f"wrote {path}")
    if result["storage"]["double_active_rate"] or result["storage"]["orphan_rate"]:
        raise typer.Exit(1)

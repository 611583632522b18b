"""`python -m bench eval` and `conversations` (only typer is imported at module level, so `--help` stays fast)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import typer

__all__ = ["conversations_command", "eval_command"]


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


def conversations_command(
    url: str | None = typer.Option(None, help="score a running API instead of starting private services"),
    api_key: str = typer.Option("dev-key", help="with --url: a key bound to conv-dev-26 and conv-dev-30"),
    modes: str = typer.Option("auto,hybrid,keyword,semantic", help="comma-separated recall modes"),
    k: int = typer.Option(10, help="hits per question"),
    ingest: bool = typer.Option(True, help="publish the turns first (--no-ingest: they are in the service)"),
    record: bool = typer.Option(True, help="write bench/results/conversations-<UTC>.json and BENCHMARKS.md's table"),
    access_recording: bool = typer.Option(
        False, help="the private API records what it serves (off: every question asks the same ledger)"
    ),
) -> None:
    """Conversational recall on the dev set: any/frac/MRR@k per category and mode, p50/p95 latency,
    beside a plain BM25 over the same turns; on private services (worker, indexer, embedder, API) unless --url.

    The private API records no accesses unless asked: each question is a probe of the same ledger, and an access
    recorded for one answer would reorder the ties of the later ones, by how much of it the worker had projected
    when they were asked, so two runs would differ."""
    import httpx
    import orjson
    from rich.progress import Progress

    from bench import conversations as cv
    from producers.settings import REPO_ROOT, get_settings

    convs = cv.load()
    chosen = [m for m in modes.split(",") if m]
    total = sum(len(cv.questions(d)) for d in convs.values())

    def run(base: str, key: str, settle: Callable[[], dict] | None = None) -> dict:
        with httpx.Client(base_url=base, headers={"X-API-Key": key}, timeout=120) as client:
            info: dict = {}
            if ingest:
                info["turns"] = cv.ingest(client, convs)
                info["searchable_after_s"] = round(cv.wait_searchable(client, convs), 1)
                if settle is not None:  # the private index, merged: equal turns, equal BM25 statistics
                    info["merged"] = settle()
            with Progress() as bar:
                task = bar.add_task("questions", total=total)
                result = cv.score(client, convs, k=k, modes=chosen, progress=lambda n: bar.advance(task, n))
            return {**info, **result}

    if url:
        result = run(url, api_key)
    else:
        from bench.services import Services, drop_private, free_port, unique_name

        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        s = get_settings().private(
            unique_name(f"conv_{stamp.lower()}"),
            api_port=free_port(),
            api_keys={"conv-key": [cv.tenant(c) for c in convs]},
            access_recording=access_recording,
        )
        try:
            with Services(s, s.log_dir / f"conversations-{stamp}") as svc:
                svc.start("worker", "indexer", "embedder", "api")
                result = {"access_recording": access_recording, **run(svc.url, "conv-key", settle=lambda: cv.settle(s))}
        finally:
            drop_private(s)
    for row in [*cv.table_rows(result), "", *cv.stage_rows(result)]:
        typer.echo(row)
    if record:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = REPO_ROOT / "bench" / "results" / f"conversations-{stamp}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps({"stamp": stamp, **result}, option=orjson.OPT_INDENT_2))
        cv.write_section(REPO_ROOT / "BENCHMARKS.md", path, result)
        typer.echo(f"wrote {path} and BENCHMARKS.md")

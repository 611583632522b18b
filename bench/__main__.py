"""`python -m bench run` (measure everything, write results + BENCHMARKS.md), `report`, `eval`, `stats`, `agent`,
`crypto`, `curve` (the cost at growing sizes).

`eval` (storage and retrieval quality of a running service) lives here, not in the product's
`ledger` command: the product never imports the benchmarks.
"""

from __future__ import annotations

from pathlib import Path

import typer

from bench.agent import agent_command
from bench.cli import conversations_command, eval_command
from bench.crypto import crypto_command
from bench.curve import curve_command
from bench.embedding import embedding_command, quality_command
from bench.machine import require_extras
from bench.publish import publish_command
from bench.receipts import receipts_command
from bench.ryw import ryw_command
from bench.stats import stats_command
from bench.workers import workers_command

app = typer.Typer(add_completion=False, no_args_is_help=True, help="memory-ledger benchmarks")


app.command(name="eval")(eval_command)
app.command(name="conversations")(conversations_command)  # the conversational dev set
app.command(name="stats")(stats_command)  # /v1/stats and /v1/stats/consistency at 100k facts (bench/stats.py)
app.command(name="agent")(agent_command)  # POST /v1/context, MCP recall beside HTTP recall (bench/agent.py)
app.command(name="crypto")(crypto_command)  # encryption off vs on: publish, ingest, seal/open (bench/crypto.py)
app.command(name="publish")(publish_command)  # SDK publish vs raw kafka-python produce (bench/publish.py)
app.command(name="receipts")(receipts_command)  # recall with and without receipts (bench/receipts.py)
app.command(name="ryw")(ryw_command)  # a write, then a read with its token, over HTTP and MCP (bench/ryw.py)
app.command(name="embedding")(embedding_command)  # the embedding stage's candidates (bench/embedding.py)
app.command(name="embedding-quality")(quality_command)  # one candidate's `ledger eval` + dev set (bench/embedding.py)
app.command(name="workers")(workers_command)  # 1, 2, 3 `ledger worker` on one topic (bench/workers.py)
app.command(name="curve")(curve_command)  # the cost curve at 10k / 100k / 1M events (bench/curve.py)


@app.command()
def run(
    events: int = typer.Option(100_000, help="events in the dataset"),
    subjects: int = typer.Option(10_000, help="subjects in the dataset"),
    seed: int = typer.Option(7, help="dataset seed"),
    recall_at: str = typer.Option("10000", help="comma-separated fact-version counts to measure recall at (+ the end)"),
    recall_queries: int = typer.Option(300, help="queries per recall mode and point"),
    raw_embed: int = typer.Option(4000, help="texts for the raw fastembed benchmark"),
    raw_es: int = typer.Option(10_000, help="documents for the raw Elasticsearch bulk benchmark"),
    lag_seconds: float = typer.Option(30.0, help="duration of the steady load for the lag probes"),
    lag_rate: float | None = typer.Option(
        None, min=1.0, help="events/s of the lag step's steady load (default: half the measured end-to-end rate)"
    ),
    eval_sample: int = typer.Option(200, help="memories sampled for self-retrieval"),
    skip: str = typer.Option(
        "", help="comma-separated steps to skip: raw, publish, recall, eval, lag, audit, rebuild, ryw"
    ),
    keep: bool = typer.Option(False, help="keep the private topic/schema/index afterwards"),
    profile: bool = typer.Option(
        False, help="py-spy the indexer/worker while ingesting and the API under exact recall"
    ),
    workers: int = typer.Option(1, min=1, help="`ledger worker` processes sharing the topic's partitions"),
    indexers: int = typer.Option(1, help="`ledger indexer` processes sharing the outbox"),
    embedders: int = typer.Option(1, help="`ledger embedder` processes sharing the embed queue"),
    note: list[str] = typer.Option([], help="a note to record with the results (repeatable)"),
    out_dir: Path | None = typer.Option(
        None, help="results folder (default bench/results, which also rewrites BENCHMARKS.md)"
    ),
) -> None:
    """Generate the dataset and measure raw components, the ledger end to end, recall, lag, audit and rebuild."""
    require_extras("matplotlib", "mcp")
    if profile:
        from bench.profile import py_spy_path

        if py_spy_path() is None:
            typer.echo(
                "bench: --profile needs py-spy: install the bench extra: .venv/bin/pip install -e '.[bench]'", err=True
            )
            raise typer.Exit(2)
    from bench.run import RunConfig, run_bench

    cfg = RunConfig(
        events=events,
        subjects=subjects,
        seed=seed,
        recall_at=tuple(int(x) for x in recall_at.split(",") if x.strip()),
        recall_queries=recall_queries,
        raw_embed=raw_embed,
        raw_es=raw_es,
        lag_seconds=lag_seconds,
        lag_rate=lag_rate,
        eval_sample=eval_sample,
        skip=tuple(x.strip() for x in skip.split(",") if x.strip()),
        keep=keep,
        profile=profile,
        workers=workers,
        indexers=indexers,
        embedders=embedders,
        **({"out_dir": out_dir} if out_dir else {}),
        notes=list(note),
    )
    path = run_bench(cfg)
    import orjson

    if "error" in orjson.loads(path.read_bytes()):
        raise typer.Exit(1)


@app.command()
def report(path: Path | None = typer.Argument(None, help="results JSON (default: the latest complete run)")) -> None:
    """Regenerate BENCHMARKS.md and the plot from a results file."""
    require_extras("matplotlib")
    from bench.report import latest_results, write_report

    typer.echo(write_report(path or latest_results()))


if __name__ == "__main__":
    app()

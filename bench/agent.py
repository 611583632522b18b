"""`python -m bench agent`: what an agent pays for memory, measured in one run on one data set.

- `POST /v1/context` over HTTP (text form, one budget): p50/p99, and the tokens of the blocks;
- `recall` as an MCP tool call over Streamable HTTP (the SDK's own `Client`, one session) beside `POST /v1/recall`
  over HTTP, same questions, the two alternating so both see the same machine load: p50/p99 each, and the
  server-side `trace.total_ms` of both (so the difference is the transport, not the engine).

1. Data: `--facts` events of bench.dataset (one tenant, `--subjects` subjects) published through the SDK to a
   private topic and projected by a real worker and indexer (bench.services), which are stopped before measuring.
   With `--reuse NAME` a private schema loaded earlier (`--keep` keeps it; its name is printed) is used as it is:
   nothing is loaded, and NAME's topic, schema and index stay afterwards.
2. Serve: the API (uvicorn `api.main:app`) and the MCP server (`ledger mcp --transport http`) as subprocesses on
   free ports, both on the private settings.
3. Ask: (subject, question) pairs sampled from the projection itself (facts with a key and an entity; the
   question is a bench.dataset paraphrase), so a reused schema needs no dataset parameters; a warm-up first.
   One client, one request at a time.

Writes bench/results/agent-<UTC>.json (and prints a table). Small by default (2,000 events) for development;
the issue's number is `--facts 100000 --subjects 10000`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

__all__ = ["agent_command"]

TENANT = "bench"
KEY = "bench-agent-key"


def agent_command(
    facts: int = typer.Option(2000, help="events of the dataset to load (the issue's run: 100000)"),
    subjects: int = typer.Option(0, help="subjects of the dataset (default: events / 10)"),
    queries: int = typer.Option(200, help="measured requests per series (after a warm-up of 20)"),
    budget: int = typer.Option(1000, help="budget_tokens of each context block"),
    seed: int = typer.Option(7, help="dataset and sampling seed"),
    reuse: str = typer.Option("", help="a private name loaded by an earlier run (--keep): measure it, load nothing"),
    keep: bool = typer.Option(False, help="keep the private topic, schema and index (to --reuse them later)"),
    out: Path | None = typer.Option(None, help="JSON output (default: bench/results/agent-<UTC>.json)"),
    timeout: float = typer.Option(3600, help="seconds to wait for the load to be projected and indexed"),
) -> None:
    """POST /v1/context p50/p99 over HTTP; MCP recall over Streamable HTTP beside POST /v1/recall."""
    import orjson

    from producers.settings import REPO_ROOT

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    result = run_agent_bench(
        events=facts,
        subjects=subjects or max(1, facts // 10),
        queries=queries,
        budget=budget,
        seed=seed,
        reuse=reuse or None,
        keep=keep,
        timeout=timeout,
        stamp=stamp,
    )
    _print(result)
    path = out or REPO_ROOT / "bench" / "results" / f"agent-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    typer.echo(f"wrote {path}")


# -- the run ------------------------------------------------------------------------------------------------------


def _settings(name: str):
    from bench.services import free_port
    from producers.settings import get_settings

    # log_level WARNING: no access line per request in the MCP server either (the API runs with --no-access-log)
    return get_settings().private(
        name, api_port=free_port(), mcp_port=free_port(), api_keys={KEY: [TENANT]}, log_level="WARNING"
    )


def _services(settings, log_dir: Path):
    """bench.services.Services that can also start `ledger mcp --transport http` ("mcp")."""
    import sys

    from bench.services import Services

    class AgentServices(Services):
        def _cmd(self, name: str) -> list[str]:
            if name != "mcp":
                return super()._cmd(name)
            return [sys.executable, "-m", "infra.cli", "mcp", "--transport", "http", "--port", str(settings.mcp_port)]

        def wait_mcp(self, timeout: float = 120.0) -> None:
            url = f"http://{settings.mcp_host}:{settings.mcp_port}/health"
            self.wait_http(url, timeout, ok=lambda r: r.is_success, every=0.3, what="MCP server")

    return AgentServices(settings, log_dir)


def _count_facts(settings) -> int:
    import psycopg

    try:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            row = conn.execute(f'SELECT count(*) FROM "{settings.pg_schema}".fact_versions').fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    return int(row[0]) if row else 0


def _load(settings, svc, events: int, subjects: int, seed: int, timeout: float) -> dict[str, Any]:
    from bench.catchup import Probe, wait_caught_up
    from bench.dataset import generate
    from bench.loader import publish_events
    from producers.topics import ensure_topics

    ensure_topics(settings)
    svc.start("worker", "indexer", "embedder")
    data = list(generate(events, subjects, seed=seed, tenants=(TENANT,)))
    publish_s = publish_events(settings, data)
    probe = Probe(settings)
    try:
        pg_s, es_s, _ = wait_caught_up(probe, timeout=timeout, alive=svc.check_alive)
    finally:
        probe.close()
    svc.stop("worker", "indexer", "embedder")  # the data is static from here: idle pollers would only add noise
    return {"events": len(data), "publish_s": round(publish_s, 2), "pg_caught_up_s": pg_s, "es_caught_up_s": es_s}


def _pairs(settings, n: int, seed: int) -> list[tuple[str, str]]:
    """(subject, question) for n facts sampled from the projection (a fixed pseudo-random order by version id)."""
    import random

    import psycopg

    from bench.dataset import ATTRIBUTES, questions_for

    keys = {a.key for a in ATTRIBUTES}
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT subject, key, entities[1] FROM "{settings.pg_schema}".fact_versions '
            "WHERE key IS NOT NULL AND cardinality(entities) > 0 AND status = 'active' "
            "ORDER BY md5(version_id || %s) LIMIT %s",
            (str(seed), n),
        ).fetchall()
    r = random.Random(seed)
    return [(subject, r.choice(questions_for(key, entity))) for subject, key, entity in rows if key in keys]


async def _measure(settings, pairs: list[tuple[str, str]], budget: int, warmup: int = 20) -> dict[str, Any]:
    """The three series over `pairs`, after the first `warmup` pairs asked once unmeasured."""
    import httpx
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from bench.latency import percentiles

    api = f"http://{settings.api_host}:{settings.api_port}"
    mcp_url = f"http://{settings.mcp_host}:{settings.mcp_port}/mcp"
    headers = {"Authorization": f"Bearer {KEY}"}
    series: dict[str, list[float]] = {"context": [], "recall_http": [], "recall_mcp": []}
    server_ms: dict[str, list[float]] = {"recall_http": [], "recall_mcp": []}
    tokens: list[int] = []
    hits = {"recall_http": 0, "recall_mcp": 0}
    async with (
        httpx.AsyncClient(base_url=api, headers=headers, timeout=60) as http,
        httpx2.AsyncClient(headers=headers, timeout=60) as mcp_http,
        Client(streamable_http_client(mcp_url, http_client=mcp_http)) as mcp,
    ):
        for i, (subject, question) in enumerate([*pairs[:warmup], *pairs]):
            measured = i >= warmup
            body = {"tenant": TENANT, "subject": subject, "question": question, "budget_tokens": budget}
            t0 = time.perf_counter()
            r = await http.post("/v1/context", json=body)
            ms = (time.perf_counter() - t0) * 1000
            r.raise_for_status()
            if measured:
                series["context"].append(ms)
                if len(tokens) < 50:  # the size of what an agent pastes: counted by the server, in the JSON form
                    doc = (await http.post("/v1/context", json={**body, "format": "json"})).json()
                    tokens.append(doc["tokens"])

            t0 = time.perf_counter()
            r = await http.post("/v1/recall", json={"tenant": TENANT, "query": question})
            ms = (time.perf_counter() - t0) * 1000
            r.raise_for_status()
            routed = r.json()
            t0 = time.perf_counter()
            called = await mcp.call_tool("recall", {"query": question})
            mcp_ms = (time.perf_counter() - t0) * 1000
            if called.is_error:
                raise RuntimeError(f"MCP recall failed: {called.content[0].text if called.content else called}")
            if measured:
                series["recall_http"].append(ms)
                series["recall_mcp"].append(mcp_ms)
                server_ms["recall_http"].append(routed["trace"]["total_ms"])
                server_ms["recall_mcp"].append(called.structured_content["trace"]["total_ms"])
                hits["recall_http"] += bool(routed["hits"])
                hits["recall_mcp"] += bool(called.structured_content["hits"])
    out: dict[str, Any] = {name: percentiles(ms) for name, ms in series.items()}
    for name, ms in server_ms.items():
        out[name]["server_total_p50_ms"] = percentiles(ms)["p50_ms"]
        out[name]["answered_with_hits"] = hits[name]
    out["context"]["budget_tokens"] = budget
    out["context"]["tokens"] = (
        {"n": len(tokens), "p50": sorted(tokens)[len(tokens) // 2], "max": max(tokens)} if tokens else None
    )
    p50_mcp, p50_http = out["recall_mcp"]["p50_ms"], out["recall_http"]["p50_ms"]
    out["mcp_over_http_recall_p50_ms"] = round(p50_mcp - p50_http, 3) if p50_mcp and p50_http else None
    return out


def run_agent_bench(
    *,
    events: int,
    subjects: int,
    queries: int,
    budget: int,
    seed: int,
    reuse: str | None,
    keep: bool,
    timeout: float,
    stamp: str,
) -> dict[str, Any]:
    import asyncio

    from bench.machine import code_version, machine_info
    from bench.services import drop_private
    from producers.settings import REPO_ROOT

    name = reuse or f"bench_agent_{stamp.lower()}"
    settings = _settings(name)
    log_dir = REPO_ROOT / ".data" / "bench-logs" / name
    svc = _services(settings, log_dir)
    result: dict[str, Any] = {
        "bench": "agent",
        "started": stamp,
        "private_name": name,
        "machine": machine_info(settings),
        "code": code_version(),
        "config": {"events": events, "subjects": subjects, "queries": queries, "budget_tokens": budget, "seed": seed},
    }
    try:
        if reuse:
            result["load"] = {"reused": reuse}
        else:
            result["load"] = _load(settings, svc, events, subjects, seed, timeout)
        result["fact_versions"] = _count_facts(settings)
        if not result["fact_versions"]:
            raise RuntimeError(f"private schema {name!r} holds no facts (load it first, or check --reuse)")
        svc.start("api", "mcp")
        svc.wait_mcp()
        pairs = _pairs(settings, queries, seed)
        result["pairs"] = len(pairs)
        result["results"] = asyncio.run(_measure(settings, pairs, budget))
    finally:
        svc.stop()
        if not (keep or reuse):
            drop_private(settings)
    result["kept"] = bool(keep or reuse)
    return result


def _print(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    res = result["results"]
    table = Table(title=f"agent bench: {result['fact_versions']:,} fact versions ({result['private_name']})")
    for col in ("series", "n", "p50 ms", "p99 ms", "server p50 ms"):
        table.add_column(col)
    for name in ("context", "recall_http", "recall_mcp"):
        r = res[name]
        server = r.get("server_total_p50_ms")
        table.add_row(name, str(r["n"]), str(r["p50_ms"]), str(r["p99_ms"]), "" if server is None else str(server))
    console = Console()
    console.print(table)
    console.print(
        f"context tokens p50 {(res['context']['tokens'] or {}).get('p50')} (budget {res['context']['budget_tokens']}); "
        f"MCP recall - HTTP recall, p50: {res['mcp_over_http_recall_p50_ms']} ms"
    )
    if result["kept"]:
        console.print(f"kept: --reuse {result['private_name']}")

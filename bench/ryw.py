"""`python -m bench ryw`: a write, then a read with its consistency token, in pairs over HTTP and over MCP.

Private services (worker, indexer, embedder, API, MCP server over Streamable HTTP) on a private name. Each pair
publishes a new value of one fact and asks for it at once: over HTTP `POST /v1/events`, then `POST /v1/recall`
and `GET .../facts` with the write's token as `after`; over MCP `remember`, then `recall` and `facts` in the same
session (which waits for the session's last write by default). A miss is an answer without the value just written;
`not_yet` (the read's bounded wait ran out) is counted apart. The time of a pair runs from just before the write
until the recall's answer; the write alone is timed too, so the ratio pair/write says what waiting for the
projection adds to the write itself. Chains run at once (one subject each), as agents would.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import typer

from bench.latency import percentiles

__all__ = ["ryw_command"]

TENANT = "bench-ryw"
KEY = "bench-ryw-key"


def ryw_command(
    pairs: int = typer.Option(1000, help="write/read pairs per door (HTTP, MCP)"),
    chains: int = typer.Option(10, help="chains at once (one subject each); pairs are split among them"),
    out: Path | None = typer.Option(None, help="JSON output (default: bench/results/ryw-<UTC>.json, and a .png)"),
) -> None:
    """Read-your-writes: misses and the time from a write to the answer that has it, over HTTP and MCP."""
    import orjson

    from bench.machine import require_extras
    from producers.settings import REPO_ROOT

    require_extras("matplotlib", "mcp")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    result = run_ryw(pairs=pairs, chains=chains, stamp=stamp)
    _print(result)
    path = out or REPO_ROOT / "bench" / "results" / f"ryw-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    _plot(result, path.with_suffix(".png"))
    typer.echo(f"wrote {path} and {path.with_suffix('.png')}")
    if any(result["doors"][door]["misses"] for door in result["doors"]):
        raise typer.Exit(1)


def run_ryw(*, pairs: int, chains: int, stamp: str) -> dict[str, Any]:
    from bench.agent import _services
    from bench.machine import code_version, machine_info
    from bench.services import drop_private, free_port, unique_name
    from producers.settings import REPO_ROOT, get_settings
    from producers.topics import ensure_topics

    name = unique_name(f"bench_ryw_{stamp.lower()}")
    settings = get_settings().private(
        name, api_port=free_port(), mcp_port=free_port(), api_keys={KEY: [TENANT]}, log_level="WARNING"
    )
    svc = _services(settings, REPO_ROOT / ".data" / "bench-logs" / name)
    result: dict[str, Any] = {
        "bench": "ryw",
        "started": stamp,
        "machine": machine_info(settings),
        "code": code_version(),
        "config": {"pairs_per_door": pairs, "chains": chains},
    }
    try:
        ensure_topics(settings)
        svc.start("worker", "indexer", "embedder", "api", "mcp")
        svc.wait_mcp()
        api = svc.url
        mcp = f"http://{settings.mcp_host}:{settings.mcp_port}/mcp"
        asyncio.run(_http_chain(api, "warmup", 5))  # first requests load what they load (not measured)
        per_chain = max(1, pairs // chains)
        result["doors"] = {
            "http": _summary(asyncio.run(_gather(_http_chain, api, chains, per_chain))),
            "mcp": _summary(asyncio.run(_gather(_mcp_chain, mcp, chains, per_chain))),
        }
    finally:
        svc.stop()
        drop_private(settings)
    return result


def _fact(subject: str, value: str) -> dict[str, Any]:
    return {
        "tenant": TENANT,
        "subject": subject,
        "key": "pref.drink",
        "value": value,
        "content": f"{subject} drinks {value}",
        "aliases": ["favourite drink"],
    }


async def _gather(chain: Any, url: str, chains: int, per_chain: int) -> list[dict[str, Any]]:
    found = await asyncio.gather(*(chain(url, f"c{n}", per_chain) for n in range(chains)))
    return [pair for pairs in found for pair in pairs]


def _judge(value: str, recalled: dict[str, Any], facts: list[dict[str, Any]]) -> str:
    """hit, miss or not_yet for one read pair (recall's first hit and the subject's facts)."""
    if recalled.get("code") == "not_yet" or recalled.get("detail"):
        return "not_yet"
    first = [h.get("value") for h in recalled.get("hits", [])][:1]
    return "hit" if first == [value] and [f.get("value") for f in facts] == [value] else "miss"


async def _http_chain(api: str, name: str, pairs: int) -> list[dict[str, Any]]:
    import httpx

    subject, out = f"user:{name}-{uuid.uuid4().hex[:6]}", []
    async with httpx.AsyncClient(base_url=api, headers={"X-API-Key": KEY}, timeout=30) as http:
        for i in range(pairs):
            value = f"drink-{name}-{i}-{uuid.uuid4().hex[:4]}"
            start = time.perf_counter()
            wrote = await http.post(
                "/v1/events", json={"events": [{"type": "memory.asserted", **_fact(subject, value)}]}
            )
            written = time.perf_counter()
            token = wrote.json()["consistency_token"]
            ask = {"tenant": TENANT, "subject": subject, "query": "favourite drink", "after": token}
            recalled = await http.post("/v1/recall", json=ask)
            answered = time.perf_counter()
            facts = await http.get(f"/v1/subjects/{subject}/facts", params={"tenant": TENANT, "after": token})
            outcome = _judge(value, recalled.json(), facts.json().get("facts", []))
            out.append({"outcome": outcome, "write_s": written - start, "pair_s": answered - start})
    return out


async def _mcp_chain(url: str, name: str, pairs: int) -> list[dict[str, Any]]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    subject, out = f"user:{name}-{uuid.uuid4().hex[:6]}", []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            # not measured: the host lists the tools when it connects, and the SDK compiles a tool's output schema
            # at its first call in a session (about 0.1 s of the client's CPU for recall's), once per session
            await client.list_tools()
            await client.call_tool("recall", {"subject": subject, "query": "favourite drink"})
            await client.call_tool("facts", {"subject": subject})
            for i in range(pairs):
                value = f"drink-{name}-{i}-{uuid.uuid4().hex[:4]}"
                start = time.perf_counter()
                wrote = await client.call_tool("remember", {**_fact(subject, value), "event_id": uuid.uuid4().hex})
                written = time.perf_counter()
                if wrote.is_error:
                    raise RuntimeError(f"remember failed: {tool_body(wrote)}")
                recalled = await client.call_tool("recall", {"subject": subject, "query": "favourite drink"})
                answered = time.perf_counter()
                facts = await client.call_tool("facts", {"subject": subject})
                outcome = _judge(value, tool_body(recalled), tool_body(facts).get("facts", []))
                out.append({"outcome": outcome, "write_s": written - start, "pair_s": answered - start})
    return out


def tool_body(result: Any) -> dict[str, Any]:
    """What an MCP tool call answered: its structured content, or the error body a tool error's text carries."""
    import orjson

    if result.is_error:
        return orjson.loads(result.content[0].text) if result.content else {}
    return result.structured_content or {}


def _summary(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    write = percentiles([p["write_s"] * 1000 for p in pairs])
    pair = percentiles([p["pair_s"] * 1000 for p in pairs])
    return {
        "pairs": len(pairs),
        "misses": sum(p["outcome"] == "miss" for p in pairs),
        "not_yet": sum(p["outcome"] == "not_yet" for p in pairs),
        "write_ms": write,
        "pair_ms": pair,
        "pair_over_write_p50": round(pair["p50_ms"] / write["p50_ms"], 2) if write["p50_ms"] else None,
        "pair_ms_all": [round(p["pair_s"] * 1000, 1) for p in pairs],
    }


def _print(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="read-your-writes: a write, then a read with its token")
    for col in ("door", "pairs", "misses", "not_yet", "write p50 ms", "pair p50 ms", "pair p99 ms", "pair/write p50"):
        table.add_column(col)
    for door, r in result["doors"].items():
        table.add_row(
            door,
            str(r["pairs"]),
            str(r["misses"]),
            str(r["not_yet"]),
            str(r["write_ms"]["p50_ms"]),
            str(r["pair_ms"]["p50_ms"]),
            str(r["pair_ms"]["p99_ms"]),
            str(r["pair_over_write_p50"]),
        )
    Console().print(table)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for door, r in result["doors"].items():
        times = sorted(r["pair_ms_all"])
        ax.plot(times, [(i + 1) / len(times) for i in range(len(times))], label=f"{door} (misses {r['misses']})")
    ax.axvline(1000, color="grey", linestyle="--", linewidth=0.8, label="target p99 1 s")
    ax.set_xscale("log")
    ax.set_xlabel("write -> answer that has it, ms (log)")
    ax.set_ylabel("share of pairs")
    ax.set_title("read-your-writes, one run")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

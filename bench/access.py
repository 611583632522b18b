"""`python -m bench.access`: what access tracking costs recall, measured in one run.

Two API processes serve the same private data (one worker, one indexer, a bench.dataset loaded through the
SDK): one records accesses (`LEDGER_ACCESS_RECORDING=true`, its accesses go to the private access topic and the
worker projects them, so the aggregates grow during the run and the prior reads them), the other does not.
The same real questions (bench.latency.recall_queries) go to both, one request at a time over HTTP (httpx,
keep-alive), interleaved request by request and in alternating order each round, so machine noise falls on
both alike. Reported per mode: client-side p50/p90/p99 for each, the p50 difference, and how many accesses the
worker projected; and, in-process, what `AccessRecorder.served` itself costs a request (it only queues).

    python -m bench.access [--events 3000] [--queries 200] [--rounds 3] [--modes exact,keyword,facts]

Writes bench/results/access-<UTC>.json (and prints it). The target: recording adds at most 1 ms to the p50.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import typer

from bench.dataset import generate
from bench.latency import percentiles, recall_queries
from bench.loader import load_dataset
from bench.machine import machine_info
from bench.services import Services, drop_private, free_port, unique_name
from producers.settings import REPO_ROOT, Settings, get_settings

__all__ = ["compare", "measure", "served_cost"]

TENANT = "bench"
KEY = "bench-access-key"


def served_cost(settings: Settings, n: int = 20_000, hits: int = 5) -> dict[str, float]:
    """Microseconds per `AccessRecorder.served` call with `hits` hits (queue only; the flush thread is not started)."""
    from api.access import AccessRecorder

    recorder = AccessRecorder(settings.model_copy(update={"access_queue_size": n + 1}), enabled=True)
    served = [{"memory_id": f"m{i}", "version_id": f"v{i}", "match": {"stage": "exact"}} for i in range(hits)]
    t0 = time.perf_counter()
    for _ in range(n):
        recorder.served(TENANT, "key:bench", served)
    per_call = (time.perf_counter() - t0) / n * 1e6
    return {"calls": n, "hits_per_call": hits, "us_per_call": round(per_call, 3)}


def _stats(client: httpx.Client) -> dict[str, Any]:
    r = client.get("/v1/stats", params={"tenant": TENANT})
    r.raise_for_status()
    return orjson.loads(r.content)["access"]


def _ask(client: httpx.Client, mode: str, item: str) -> tuple[httpx.Response, str]:
    """One read of `mode`: a recall of the question `item`, or (`facts`) the facts of the subject `item`; and the
    field of its answer that lists what it shows."""
    if mode == "facts":
        return client.get(f"/v1/subjects/{quote(item, safe='')}/facts", params={"tenant": TENANT}), "facts"
    return client.post("/v1/recall", content=orjson.dumps({"tenant": TENANT, "query": item, "mode": mode})), "hits"


def measure(urls: dict[str, str], asks: dict[str, list[str]], rounds: int, warmup: int = 20) -> dict[str, Any]:
    """Interleaved client-side latencies per mode and variant (see the module docstring); `urls`: two variants, the
    one measured first and the one it is compared with (`p50_added_ms` = first - second); `asks`: mode -> what is
    asked of it (`_ask`)."""
    headers = {"X-API-Key": KEY, "Content-Type": "application/json"}
    clients = {name: httpx.Client(base_url=url, headers=headers, timeout=30) for name, url in urls.items()}
    names = list(urls)
    out: dict[str, Any] = {}
    try:
        for mode, items in asks.items():
            for item in items[:warmup]:
                for name in names:
                    _ask(clients[name], mode, item)
            ms: dict[str, list[float]] = {name: [] for name in names}
            hits: dict[str, int] = dict.fromkeys(names, 0)
            for r in range(rounds):
                order = names if r % 2 == 0 else names[::-1]
                for item in items:
                    for name in order:
                        t0 = time.perf_counter()
                        resp, shown = _ask(clients[name], mode, item)
                        ms[name].append((time.perf_counter() - t0) * 1000)
                        if resp.status_code != 200:
                            raise RuntimeError(f"{mode} on {name}: {resp.status_code} {resp.text[:300]}")
                        hits[name] += len(orjson.loads(resp.content)[shown])
            res = {name: {**percentiles(ms[name]), "hits_served": hits[name]} for name in names}
            on, off = res[names[0]], res[names[1]]
            res["p50_added_ms"] = round(on["p50_ms"] - off["p50_ms"], 3)
            res["p50_added_pct"] = round(100 * (on["p50_ms"] - off["p50_ms"]) / off["p50_ms"], 2)
            res["median_of_paired_differences_ms"] = round(
                statistics.median(a - b for a, b in zip(ms[names[0]], ms[names[1]], strict=True)), 3
            )
            out[mode] = res
    finally:
        for c in clients.values():
            c.close()
    return out


def compare(
    name: str,
    variants: dict[str, dict[str, Any]],
    events: int,
    queries: int,
    rounds: int,
    modes: str,
    report: Any = None,
) -> dict[str, Any]:
    """Load a dataset once into private names, start one API process per variant (two: settings updates) on it,
    measure recall interleaved (`measure`); `report(settings, urls)` adds to the result before the stop."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = get_settings()
    settings = base.private(unique_name(f"bench_{name}_{stamp.lower()}"), api_keys={KEY: [TENANT]})
    log_dir = base.data_dir / "bench" / f"{name}-{stamp}"
    started = time.time()
    apis = {
        v: Services(settings.model_copy(update={"api_port": free_port(), **update}), log_dir / v)
        for v, update in variants.items()
    }
    first = next(iter(apis.values()))
    try:
        first.start("worker", "indexer", "embedder")
        loaded = load_dataset(settings, events, max(1, events // 10), tenant=TENANT, timeout=3600)
        typer.echo(f"loaded {loaded['events']:,} events; PG+ES caught up after {loaded['es_caught_up_s']:.1f}s")
        for api in apis.values():
            api.start("api")
        dataset = list(generate(events, max(1, events // 10), tenants=(TENANT,)))
        qs = recall_queries(dataset, TENANT, queries)
        subjects = sorted({e["subject"] for e in dataset if e.get("tenant") == TENANT and e.get("subject")})
        asks = {m: subjects[:queries] if m == "facts" else qs for m in modes.split(",") if m}
        urls = {v: api.url for v, api in apis.items()}
        result = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": machine_info(settings),
            "dataset": {"events": events, "subjects": max(1, events // 10), "queries_per_mode": len(qs)},
            "rounds": rounds,
            "latency": measure(urls, asks, rounds),
        }
        if report is not None:
            result.update(report(settings, urls))
        result["seconds"] = round(time.time() - started, 1)
    finally:
        for api in reversed(apis.values()):
            api.stop()
        drop_private(settings)
    return result


def write(result: dict[str, Any], name: str, out: Path | None) -> None:
    """`bench/results/<name>-<UTC>.json` (or `out`), and the result printed."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out or REPO_ROOT / "bench" / "results" / f"{name}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    typer.echo(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    typer.echo(f"wrote {path}")


# the options of a comparison (this module's command and bench.receipts')
EVENTS = typer.Option(3000, help="events in the dataset")
QUERIES = typer.Option(200, help="distinct questions per mode")
ROUNDS = typer.Option(3, help="passes over the questions (alternating which API is asked first)")
MODES = typer.Option("exact,keyword", help="recall modes to measure, and `facts` (a subject's facts)")


def main(
    events: int = EVENTS,
    queries: int = QUERIES,
    rounds: int = ROUNDS,
    modes: str = MODES,
    out: Path | None = typer.Option(None, help="JSON output (default: bench/results/access-<UTC>.json)"),
) -> None:
    def projected(settings: Settings, urls: dict[str, str]) -> dict[str, Any]:
        time.sleep(2 * settings.access_flush_s + 2)  # the last accesses flushed and projected
        with httpx.Client(base_url=urls["recording"], headers={"X-API-Key": KEY}, timeout=30) as client:
            access = _stats(client)
        return {
            "served_call": served_cost(settings),
            "access_projection_after_run": {k: v for k, v in access.items() if k != "most_served"},
            "target": "recording adds <= 1 ms to recall's p50",
        }

    variants = {"recording": {"access_recording": True}, "not_recording": {"access_recording": False}}
    write(compare("access", variants, events, queries, rounds, modes, projected), "access", out)


if __name__ == "__main__":
    typer.run(main)

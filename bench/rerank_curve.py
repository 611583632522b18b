"""The rerank stage's quality/latency curve on the conversational dev set: how deep into the fused pool to rerank.

`python -m bench.rerank_curve [--step 3]` starts private services (worker, indexer, embedder, API), publishes the
dev set as `python -m bench conversations` does, then in-process asks every `step`-th question in `auto` mode for
100 hits with `"rerank": false` (the fused pool, as the rerank stage sees it) and scores the first 50 fuzzy hits
with the configured cross-encoder (LEDGER_RERANK_MODEL / _MAX_TOKENS / _THREADS). For each depth N it reports:
any@10, frac@10 and MRR@10 when the first N fuzzy hits are reordered by the cross-encoder (ties by the fused
order, as recall.rerank does; exact hits stay first), and the median and p95 time of scoring those N pairs as the
stage does (head first, LEDGER_RERANK_BATCH_SIZE a batch): wall time, and the scoring thread's CPU time, which
other work on the host inflates far less (with one onnxruntime thread the model runs on the calling thread).
Writes bench/results/rerank-curve-<UTC>.json and .png. `--save FILE` keeps the pools, `--pools FILE` scores
saved ones without starting services, so model settings can be compared on the same pools.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import typer

from bench import conversations as cv
from producers.settings import REPO_ROOT, Settings, get_settings

DEPTHS = (0, 6, 10, 12, 15, 20, 30, 50)


async def _pools(s: Settings, step: int) -> list[dict[str, Any]]:
    from psycopg_pool import AsyncConnectionPool

    from projections.postgres.connection import configure_pool
    from projections.search.client import async_es_client
    from projections.search.recall.engine import RecallEngine
    from projections.search.recall.model import RecallQuery

    convs = cv.load()
    qs = [(conv, qa) for conv, d in convs.items() for qa in cv.questions(d)][::step]
    es = async_es_client(s, request_timeout=30)
    pool = AsyncConnectionPool(s.pg_dsn, min_size=1, max_size=4, configure=configure_pool(s.pg_schema), open=False)
    await pool.open()
    engine = RecallEngine(s, es, pool)
    out = []
    try:
        for conv, qa in qs:
            r = await engine.recall(RecallQuery(tenant=cv.tenant(conv), query=qa["question"], top_k=100, rerank=False))
            out.append(
                {
                    "q": qa["question"],
                    "cat": qa["category"],
                    "ev": [e.strip() for e in qa["evidence"]],
                    "refs": [(h.get("source") or {}).get("ref") for h in r["hits"]],
                    "content": [h["content"] for h in r["hits"]],
                    "fuzzy": [i for i, h in enumerate(r["hits"]) if h["match"]["stage"] != "exact"],
                }
            )
    finally:
        await engine.aclose()
        await pool.close()
        await es.close()
    return out


def _score(s: Settings, rows: list[dict[str, Any]]) -> None:
    """Cross-encoder scores of the first max(DEPTHS) fuzzy hits, and the time of scoring the first N, per depth."""
    from projections.reranker import load_cross_encoder

    ce = load_cross_encoder(s)
    for r in rows:
        idx = r["fuzzy"][: max(DEPTHS)]
        r["ce"], r["ms"], r["cpu_ms"] = {}, {}, {}
        for depth in DEPTHS[1:]:
            part = idx[:depth]  # head first, as recall.rerank scores them
            t0, c0 = time.perf_counter(), time.thread_time()
            scores = []
            for b in range(0, len(part), s.rerank_batch_size):
                scores += ce.score(r["q"], [r["content"][i] for i in part[b : b + s.rerank_batch_size]])
            r["ms"][depth] = (time.perf_counter() - t0) * 1000
            r["cpu_ms"][depth] = (time.thread_time() - c0) * 1000
            if depth == max(DEPTHS):
                r["ce"] = {i: round(x, 4) for i, x in zip(part, scores, strict=True)}


def curve(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per depth: the metrics@10 overall and per category, and the scoring time (median, p95)."""
    out = []
    for depth in DEPTHS:
        sums: dict[str, list[float]] = {}
        for r in rows:
            refs, idx = list(r["refs"]), r["fuzzy"][:depth]
            new = list(refs)
            for place, i in zip(idx, sorted(idx, key=lambda i: (-r["ce"][i], i)), strict=True):
                new[place] = refs[i]
            m = cv.metrics(new, r["ev"], 10)
            for key in (cv.CATEGORIES[r["cat"]], "all"):
                v = sums.setdefault(key, [0.0, 0.0, 0.0, 0])
                v[0], v[1], v[2], v[3] = v[0] + m[0], v[1] + m[1], v[2] + m[2], v[3] + 1
        ms = sorted(r["ms"][depth] for r in rows) if depth else [0.0]
        cpu = sorted(r["cpu_ms"][depth] for r in rows) if depth else [0.0]
        out.append(
            {
                "depth": depth,
                **{
                    k: {"n": int(v[3]), "any": v[0] / v[3], "frac": v[1] / v[3], "mrr": v[2] / v[3]}
                    for k, v in sums.items()
                },
                "p50_ms": statistics.median(ms),
                "p95_ms": ms[min(len(ms) - 1, int(len(ms) * 0.95))],
                "cpu_p50_ms": statistics.median(cpu),
                "cpu_p95_ms": cpu[min(len(cpu) - 1, int(len(cpu) * 0.95))],
            }
        )
    return out


def plot(points: list[dict[str, Any]], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p["cpu_p50_ms"] for p in points]
    for key, label, color in (("any", "any@10", "#4a90d9"), ("mrr", "MRR@10", "#d9534f")):
        ys = [p["all"][key] for p in points]
        ax.plot(xs, ys, "o-", color=color, label=label)
        for p, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(f"{p['depth']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("cross-encoder CPU time per question, median ms (labels: pairs reranked)")
    ax.set_ylabel("dev set, auto mode")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _fresh_pools(s: Settings, stamp: str, step: int) -> list[dict[str, Any]]:
    """The pools of every step-th question, on private services the dev set is published to first."""
    from bench.services import Services, drop_private

    convs = cv.load()
    try:
        with Services(s, s.log_dir / f"rerank-curve-{stamp}") as svc:
            svc.start("worker", "indexer", "embedder", "api")
            with httpx.Client(base_url=svc.url, headers={"X-API-Key": "conv-key"}, timeout=120) as client:
                cv.ingest(client, convs)
                cv.wait_searchable(client, convs)
            return asyncio.run(_pools(s, step))
    finally:
        drop_private(s)


def main(
    step: int = typer.Option(3, help="every step-th question of the 231"),
    save: Path | None = typer.Option(None, help="write the pools to this file"),
    pools: Path | None = typer.Option(None, help="score every step-th pool of this file (--save): no services"),
) -> None:
    from bench.services import free_port, unique_name

    convs = cv.load()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    s = get_settings().private(
        unique_name(f"curve_{stamp.lower()}"),
        api_port=free_port(),
        api_keys={"conv-key": [cv.tenant(c) for c in convs]},
    )
    rows = orjson.loads(pools.read_bytes())[::step] if pools else _fresh_pools(s, stamp, step)
    if save:
        save.write_bytes(orjson.dumps(rows))
    _score(s, rows)
    points = curve(rows)
    base = REPO_ROOT / "bench" / "results" / f"rerank-curve-{stamp}"
    meta = {
        "model": s.rerank_model,
        "max_tokens": s.rerank_max_tokens,
        "batch": s.rerank_batch_size,
        "threads": 1,  # the pairs are timed one after the other on this thread: the CPU a depth costs
        "questions": len(rows),
    }
    base.with_suffix(".json").write_bytes(
        orjson.dumps({"stamp": stamp, "step": step, **meta, "points": points}, option=orjson.OPT_INDENT_2)
    )
    title = f"{s.rerank_model}, {s.rerank_max_tokens} tokens, {s.rerank_batch_size} a batch, {len(rows)} questions"
    plot(points, base.with_suffix(".png"), title)
    for p in points:
        a = p["all"]
        typer.echo(
            f"depth {p['depth']:>3}: any {a['any']:.3f} frac {a['frac']:.3f} MRR {a['mrr']:.3f}  "
            f"p50 {p['p50_ms']:.0f} ms p95 {p['p95_ms']:.0f} ms "
            f"(CPU p50 {p['cpu_p50_ms']:.0f} p95 {p['cpu_p95_ms']:.0f})"
        )
    typer.echo(f"wrote {base}.json and .png")


if __name__ == "__main__":
    typer.run(main)

"""`python -m bench embedding`: the embedding stage's candidates, measured on this machine in one run.

Each candidate is a set of embedding settings (models, onnxruntime threads, batch sizes, length-sorted batches)
and an embedded text (`full` = cues.embedding_text: statement + key words + aliases, as stored today; `statement`
= the statement alone). Every candidate runs in a fresh process of its own (its RSS is its models' alone), warms
its models up, then embeds the same two corpora the way `ledger embedder` does (projections.embedding.Embedders
over claims of `embedder_batch_size` versions, so English text costs two models with `embed_cross_language`):

  facts  bench.dataset's asserted texts (seed 7, Chinese and English about half each)
  turns  the conversational dev set's turns (DEV_SET, English), as the shared harness's run_dev.py stores them

Printed per candidate and corpus: versions/s of the whole stage (wall and CPU), texts/s per model, the ratio
to the first candidate (today's configuration), the RSS after warm-up and at the end, and the cosine of each
vector to the first candidate's vector of the same text when both come from the same model family (an int8
variant against its fp32 original). The first candidate runs again at the end, to show the machine's noise.
"""

from __future__ import annotations

import json
import multiprocessing
import resource
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import typer

__all__ = ["CANDIDATES", "Candidate", "embedding_command", "load_corpora", "measure", "quality_command"]

ROOT = Path(__file__).resolve().parents[1]
DEV_SET = ROOT.parent / "shared" / "eval" / "conversations"  # the shared dev-set harness's data, beside the repo
TODAY = {
    "embed_model": "BAAI/bge-small-zh-v1.5",
    "embed_model_en": "BAAI/bge-small-en-v1.5-int8",
    "embed_threads": 1,
    "embedder_batch_size": 64,
    "embed_cross_language": True,
}
ZH8 = "BAAI/bge-small-zh-v1.5-int8"
MINILM8 = "sentence-transformers/all-MiniLM-L6-v2-int8"
COMPARED = 200  # texts per corpus whose vectors are compared with the first candidate's


@dataclass(frozen=True)
class Candidate:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)  # over TODAY
    text: str = "full"  # or "statement"


CANDIDATES: dict[str, Candidate] = {
    c.name: c
    for c in (
        Candidate("today"),
        Candidate("today-t2", {"embed_threads": 2}),
        Candidate("zh8", {"embed_model": ZH8}),
        Candidate("zh8-t2", {"embed_model": ZH8, "embed_threads": 2}),
        Candidate("zh8-statement", {"embed_model": ZH8}, text="statement"),
        Candidate("zh8-minilm8", {"embed_model": ZH8, "embed_model_en": MINILM8}),
        Candidate("zh8-no-cross", {"embed_model": ZH8, "embed_cross_language": False}),
        Candidate("today-statement", text="statement"),
    )
}


def load_corpora(facts: int, turns: int, conversations: Path) -> dict[str, list[tuple[str, str]]]:
    """Per corpus, (full text, statement alone) of each text: facts from bench.dataset, turns from the dev set."""
    from bench.dataset import generate
    from projections.search.cues import embedding_text

    fact_texts = []
    for e in generate(facts * 3, max(facts // 2, 10), seed=7):
        if e["type"] == "memory.asserted" and e.get("content"):
            fact_texts.append((embedding_text(e["content"], e.get("key"), e.get("aliases") or ()), e["content"]))
            if len(fact_texts) == facts:
                break
    turn_texts: list[tuple[str, str]] = []
    for path in sorted(conversations.glob("locomo-*.json")):
        d = json.loads(path.read_text())
        n = 1
        while f"session_{n}" in d:
            for t in d[f"session_{n}"]:
                text = t["text"] + (f" [shares a photo: {t['blip_caption']}]" if t.get("blip_caption") else "")
                content = f"{t['speaker']}: {text}"  # as run_dev.py publishes it (no key, no aliases)
                turn_texts.append((content, content))
            n += 1
    return {"facts": fact_texts, "turns": turn_texts[:turns]}


def _rss_kb() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1])
    return out


def measure(candidate: Candidate, corpora: dict[str, list[tuple[str, str]]]) -> dict[str, Any]:
    """In this process: load the candidate's models, warm them up, run the stage over each corpus."""
    from producers.settings import Settings
    from projections.embedding import Embedders

    conf = {**TODAY, **candidate.settings}
    s = Settings().model_copy(update=conf)
    embedders = Embedders(s)
    spent: dict[str, list[float]] = {}  # model -> [texts, wall seconds]
    from projections.models import configured_models

    loaded_at = time.perf_counter()
    for name in configured_models(s):
        model = embedders.model(name)
        model.embed(["warm up 预热", "another warm-up text of a few words"] * 8)
        original = model.embed

        def timed(texts, _orig=original, _name=name):
            t0 = time.perf_counter()
            out = _orig(texts)
            row = spent.setdefault(_name, [0, 0.0])
            row[0] += len(texts)
            row[1] += time.perf_counter() - t0
            return out

        model.embed = timed  # type: ignore[method-assign]
    warm = {"load_s": round(time.perf_counter() - loaded_at, 2), **_rss_kb()}
    result: dict[str, Any] = {"candidate": asdict(candidate), "settings": conf, "warm": warm, "corpora": {}}
    claim = s.embedder_batch_size
    for corpus, pairs in corpora.items():
        texts = [full if candidate.text == "full" else statement for full, statement in pairs]
        spent.clear()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        sample: list[list[tuple[str, str, list[float]]]] = []
        for i in range(0, len(texts), claim):
            vecs = embedders.vectors(texts[i : i + claim])
            if len(sample) < COMPARED:
                sample.extend(vecs[: COMPARED - len(sample)])
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        result["corpora"][corpus] = {
            "versions": len(texts),
            "vectors": sum(n for n, _ in spent.values()),
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "versions_per_s": round(len(texts) / wall, 1),
            "versions_per_cpu_s": round(len(texts) / cpu, 1),
            "models": {m: {"texts": n, "texts_per_s": round(n / t, 1) if t else None} for m, (n, t) in spent.items()},
            "sample": [[(f, m, v) for f, m, v in per] for per in sample],
        }
    result["end"] = {**_rss_kb(), "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    return result


def _family(model: str) -> str:
    return model.removesuffix("-int8")


def _cosines(base: list, other: list) -> dict[str, float] | None:
    """Mean / min cosine between the two runs' vectors of the same field and model family, text by text."""
    cos = []
    for b, o in zip(base, other, strict=False):
        bv = {f: (m, v) for f, m, v in b}
        for f, m, v in o:
            if f in bv and _family(bv[f][0]) == _family(m) and len(bv[f][1]) == len(v):
                cos.append(float(np.dot(np.asarray(bv[f][1]), np.asarray(v))))
    if not cos:
        return None
    return {"mean": round(float(np.mean(cos)), 4), "min": round(float(np.min(cos)), 4), "n": len(cos)}


def _short(model: str) -> str:
    return model.split("/")[-1].replace("bge-small-", "").replace("-v1.5", "")


def embedding_command(
    candidates: str = typer.Option(",".join(CANDIDATES), help="comma-separated candidate names (the first is 1.0x)"),
    facts: int = typer.Option(2000, help="bench.dataset texts"),
    turns: int = typer.Option(600, help="conversational dev-set turns"),
    conversations: Path = typer.Option(DEV_SET, help="the dev set"),
    repeat_first: bool = typer.Option(True, help="run the first candidate again at the end (the machine's noise)"),
    out: Path | None = typer.Option(None, help="results JSON (default bench/results/embedding-<time>.json)"),
) -> None:
    """Embedding stage throughput per candidate: versions/s, texts/s per model, RSS, cosine to today."""
    names = [n.strip() for n in candidates.split(",") if n.strip()]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise typer.BadParameter(f"unknown candidates {unknown}; known: {', '.join(CANDIDATES)}")
    from bench.machine import code_version, load_average

    load_start = load_average()
    corpora = load_corpora(facts, turns, conversations)
    typer.echo(f"corpora: facts {len(corpora['facts'])}, turns {len(corpora['turns'])}")
    order = names + ([names[0]] if repeat_first and len(names) > 1 else [])
    ctx = multiprocessing.get_context("spawn")
    results = []
    started = datetime.now(UTC)
    for name in order:
        with ctx.Pool(1) as pool:  # a fresh process per candidate: its own RSS and onnxruntime sessions
            results.append(pool.apply(measure, (CANDIDATES[name], corpora)))
        r = results[-1]
        typer.echo(
            f"{name}: "
            + ", ".join(f"{c} {v['versions_per_s']} versions/s" for c, v in r["corpora"].items())
            + f", RSS {r['end']['VmRSS'] // 1024} MB"
        )
    base = results[0]
    rows = []
    for r in results:
        row: dict[str, Any] = {"name": r["candidate"]["name"], "rss_warm_mb": r["warm"]["VmRSS"] // 1024}
        row["rss_end_mb"], row["hwm_mb"] = r["end"]["VmRSS"] // 1024, r["end"]["VmHWM"] // 1024
        for c, v in r["corpora"].items():
            b = base["corpora"][c]
            row[c] = {
                "versions_per_s": v["versions_per_s"],
                "ratio": round(v["versions_per_s"] / b["versions_per_s"], 2),
                "cpu_ratio": round(v["versions_per_cpu_s"] / b["versions_per_cpu_s"], 2),
                "texts_per_s": {_short(m): x["texts_per_s"] for m, x in v["models"].items()},
                "cosine_to_first": _cosines(b["sample"], v["sample"]),
            }
        rows.append(row)
    typer.echo(
        "\n| candidate | facts versions/s (x) | turns versions/s (x) | texts/s per model (facts; turns) | RSS MB |"
    )
    typer.echo("|---|---|---|---|---|")
    for row in rows:
        f, t = row["facts"], row["turns"]
        per = "; ".join(", ".join(f"{m} {x}" for m, x in row[c]["texts_per_s"].items()) for c in ("facts", "turns"))
        typer.echo(
            f"| {row['name']} | {f['versions_per_s']} ({f['ratio']}x, cpu {f['cpu_ratio']}x) | "
            f"{t['versions_per_s']} ({t['ratio']}x, cpu {t['cpu_ratio']}x) | {per} | "
            f"{row['rss_warm_mb']} / {row['rss_end_mb']} |"
        )
    for row in rows:
        cos = {c: row[c]["cosine_to_first"] for c in ("facts", "turns")}
        typer.echo(f"cosine to {rows[0]['name']}: {row['name']}: {cos}")
    for r in results:
        for v in r["corpora"].values():
            v.pop("sample")
    path = out or ROOT / "bench" / "results" / f"embedding-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "started": started.isoformat(),
        "load_average": {"start": load_start, "end": load_average()},
        "code": code_version(),
        "rows": rows,
        "runs": results,
    }
    path.write_text(json.dumps(payload, indent=1, default=str))
    typer.echo(f"written {path}")


QUALITY_TENANT, QUALITY_KEY = "bench", "eval-key"
DEV_TENANTS = ("conv-dev-26", "conv-dev-30")


def quality_command(
    candidate: str = typer.Argument(..., help="a candidate name (its text must be `full`: what the product stores)"),
    events: int = typer.Option(1500, help="bench.dataset events for `ledger eval` (as tests/test_eval.py)"),
    conversations: Path = typer.Option(DEV_SET, help="the dev set"),
    rerank: bool = typer.Option(False, help="the rerank stage (time-budgeted, so load-dependent: off to compare)"),
    out: Path | None = typer.Option(None, help="results JSON (default bench/results/embedding-quality-<...>.json)"),
) -> None:
    """`ledger eval` and the conversational dev set for one candidate, on a private stack of its own (worker,
    indexer, embedder, API as subprocesses), dropped afterwards."""
    import subprocess
    import sys

    from bench.catchup import Probe, wait_caught_up
    from bench.dataset import generate
    from bench.eval import run_eval, summary_rows
    from bench.loader import publish_events
    from bench.services import Services, drop_private, free_port
    from infra.model import install
    from producers.settings import Settings

    c = CANDIDATES[candidate]
    if c.text != "full":
        raise typer.BadParameter("only the stored text (`full`) can be scored end to end")
    started = datetime.now(UTC)
    name = f"emq_{candidate.replace('-', '_')}_{started.strftime('%H%M%S')}"
    keys = {QUALITY_KEY: [QUALITY_TENANT, *DEV_TENANTS]}
    s = Settings().private(name, api_port=free_port(), api_keys=keys, rerank_enabled=rerank, **{**TODAY, **c.settings})
    install(s)  # the candidate's models, from Maven once, as `python -m infra up model` does
    result: dict[str, Any] = {"candidate": asdict(c), "settings": {**TODAY, **c.settings}, "rerank": rerank}
    run_dev = [sys.executable, str(conversations / "run_dev.py")]
    try:
        with Services(s, ROOT / ".data" / "logs" / name) as svc:
            svc.start("worker", "indexer", "embedder", "api")
            t0 = time.perf_counter()
            publish_events(s, list(generate(events, events // 10, seed=7, tenants=(QUALITY_TENANT,))))
            probe = Probe(s)
            try:
                wait_caught_up(probe, timeout=900, alive=svc.check_alive)
                result["eval_ingest_s"] = round(time.perf_counter() - t0, 1)
                ev = run_eval(
                    s, svc.url, QUALITY_KEY, QUALITY_TENANT, sample=200, paraphrase_sample=60, unanswerable=30
                )
                result["eval"] = [list(r) for r in summary_rows(ev)]
                for layer, metric, value, target in summary_rows(ev):
                    typer.echo(f"{layer} {metric:<55} {value} {target}")
                t0 = time.perf_counter()
                subprocess.run([*run_dev, "ingest", "--url", svc.url, "--key", QUALITY_KEY], check=True)
                wait_caught_up(probe, timeout=900, alive=svc.check_alive)
                result["dev_ingest_s"] = round(time.perf_counter() - t0, 1)
                typer.echo(f"dev set ingested and embedded in {result['dev_ingest_s']} s")
            finally:
                probe.close()
            dev_json = ROOT / ".data" / "logs" / name / "dev.json"
            subprocess.run(
                [*run_dev, "score", "--url", svc.url, "--key", QUALITY_KEY, "--modes", "auto,hybrid,semantic"]
                + ["--json", str(dev_json)],
                check=True,
            )
            result["dev"] = json.loads(dev_json.read_text())
    finally:
        drop_private(s)
    path = (
        out or ROOT / "bench" / "results" / f"embedding-quality-{candidate}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    )
    path.write_text(json.dumps(result, indent=1, default=str))
    typer.echo(f"written {path}")

"""Conversational recall on the dev set: any@k, frac@k and MRR@k per category and mode, with latency.

The protocol is the shared dev-set harness's (run_dev.py, kept outside this repository), so the numbers compare with
the held-out set's, which is scored the same way outside the project: every dialog turn of two LoCoMo
conversations (bench/data/conversations, CC BY-NC 4.0, see its NOTICE) is one episodic memory published through
`POST /v1/events` (subject `person:<speaker>`, content "<speaker>: <text>", source.ref the turn's id, observed at
the session's time + i seconds); every question of categories 1-4 with evidence is one `POST /v1/recall`; a hit
is a returned memory whose source.ref is an evidence turn. A plain OR-semantics BM25 over the same turns is
computed in the same run as the line to beat.

  any@k   at least one evidence turn in the top k
  frac@k  the share of the evidence turns in the top k
  MRR@k   1 / rank of the first evidence turn
  pool any@50 / any@100   the same question asked for 100 hits with `"rerank": false`: any@50 and any@100 of the
          fused candidate pool before the rerank stage reorders its head (the ceiling of what a reranker can lift
          into the top k; the pool is the same as the top-k request's while `recall_pool` >= 100)

`python -m bench conversations` runs it on private services it starts (worker, indexer, embedder, API) and
records the table in bench/results and BENCHMARKS.md; `--url` scores a running service instead (its key must
be bound to the tenants conv-dev-26 and conv-dev-30). tests/test_conversations_eval.py keeps a floor in CI.
"""

from __future__ import annotations

import collections
import datetime as dt
import math
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import orjson

__all__ = [
    "CATEGORIES",
    "DATA",
    "MODES",
    "BM25",
    "ingest",
    "load",
    "questions",
    "score",
    "settle",
    "table_rows",
    "tenant",
    "turns",
    "wait_searchable",
    "write_section",
]

DATA = Path(__file__).resolve().parent / "data" / "conversations"
CONVS = ("26", "30")
MODES = ("auto", "hybrid", "keyword", "semantic")
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
BASELINE = "bm25 (baseline)"


def load(data: Path = DATA) -> dict[str, dict]:
    return {c: orjson.loads((data / f"locomo-{c}.json").read_bytes()) for c in CONVS}


def tenant(conv: str) -> str:
    return f"conv-dev-{conv}"


def turns(d: dict) -> list[dict]:
    """The conversation's turns in order, each with its session's time (+ i seconds)."""
    out, n = [], 1
    while f"session_{n}" in d:
        when = dt.datetime.strptime(d[f"session_{n}_date_time"].strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=dt.UTC)
        for i, t in enumerate(d[f"session_{n}"]):
            text = t["text"] + (f" [shares a photo: {t['blip_caption']}]" if t.get("blip_caption") else "")
            ts = (when + dt.timedelta(seconds=i)).isoformat().replace("+00:00", "Z")
            out.append({"dia_id": t["dia_id"], "speaker": t["speaker"], "text": text, "ts": ts})
        n += 1
    return out


def questions(d: dict) -> list[dict]:
    return [q for q in d["qa"] if q.get("category") in CATEGORIES and q.get("evidence")]


def events(conv: str, d: dict) -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"conv-dev-{conv}-{t['dia_id']}",
            "type": "memory.asserted",
            "tenant": tenant(conv),
            "subject": "person:" + t["speaker"].lower(),
            "kind": "episodic",
            "content": f"{t['speaker']}: {t['text']}",
            "observed_at": t["ts"],
            "valid_from": t["ts"],
            "source": {"type": "imported", "service": "conversations", "ref": t["dia_id"]},
        }
        for t in turns(d)
    ]


def ingest(client: httpx.Client, convs: dict[str, dict]) -> int:
    """Publish every turn through `POST /v1/events` in batches of 200; how many."""
    n = 0
    for conv, d in convs.items():
        evs = events(conv, d)
        for i in range(0, len(evs), 200):
            r = client.post("/v1/events", json={"events": evs[i : i + 200]})
            if r.status_code >= 300:
                raise RuntimeError(f"publish failed {r.status_code}: {r.text[:300]}")
        n += len(evs)
    return n


def wait_searchable(client: httpx.Client, convs: dict[str, dict], timeout: float = 900.0) -> float:
    """Until every turn is applied and searchable by every stage (`/v1/stats`: all events, nothing pending)."""
    t0 = time.monotonic()
    want = {conv: len(turns(d)) for conv, d in convs.items()}
    while True:
        done = True
        for conv, n in want.items():
            body = client.get("/v1/stats", params={"tenant": tenant(conv)}).json()
            done &= body.get("events_applied", 0) >= n and body.get("search_pending", 1) == 0
        if done:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"the dev set was not searchable after {timeout:.0f}s")
        time.sleep(0.5)


def settle(settings: Any) -> dict[str, int]:
    """Merge the private index into one segment, which drops the deleted copies of rewritten documents (every turn
    is written twice: without its vectors, then with them). BM25's statistics count those copies until a merge
    drops them, and how many are left depends on when the index happened to merge: without this two runs of equal
    turns score the keyword stage differently. The index's documents before: {"docs", "deleted"}."""
    from projections.search.client import es_client

    es = es_client(settings, request_timeout=300)
    try:
        docs = es.indices.stats(index=settings.es_index, metric="docs")["_all"]["primaries"]["docs"]
        es.indices.forcemerge(index=settings.es_index, max_num_segments=1)
        es.indices.refresh(index=settings.es_index)
    finally:
        es.close()
    return {"docs": docs["count"], "deleted": docs["deleted"]}


TOKEN = re.compile(r"[a-z0-9]+")


def toks(s: str) -> list[str]:
    return TOKEN.findall(s.lower())


class BM25:
    """Okapi BM25 (k1=1.2, b=0.75), OR semantics, over the turns as written: the line to beat."""

    def __init__(self, docs: list[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.docs = [toks(x) for x in docs]
        self.avg = sum(map(len, self.docs)) / max(1, len(self.docs))
        df = collections.Counter(w for d in self.docs for w in set(d))
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        self.tf = [collections.Counter(d) for d in self.docs]
        self.k1, self.b = k1, b

    def top(self, q: str, k: int) -> list[int]:
        qs = toks(q)
        scores = []
        for i, tf in enumerate(self.tf):
            norm = self.k1 * (1 - self.b + self.b * len(self.docs[i]) / self.avg)
            scores.append(sum(self.idf[w] * tf[w] * (self.k1 + 1) / (tf[w] + norm) for w in qs if w in tf))
        return sorted(range(len(self.docs)), key=lambda i: -scores[i])[:k]


def metrics(ranked: list[str | None], evidence: Iterable[str], k: int) -> tuple[float, float, float]:
    ev, top = set(evidence), ranked[:k]
    found = {r for r in top if r in ev}
    rr = next((1.0 / (i + 1) for i, r in enumerate(top) if r in ev), 0.0)
    return (1.0 if found else 0.0), len(found) / len(ev), rr


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * q))], 1)


def score(
    client: httpx.Client,
    convs: dict[str, dict],
    *,
    k: int = 10,
    modes: Iterable[str] = MODES,
    progress: Callable[[int], None] | None = None,
    pool: bool = True,
) -> dict[str, Any]:
    """Every scored question through every mode, and BM25: {system: {category|"all": {n, any, frac, mrr, and for a
    mode pool50, pool100}}} and {mode: {p50_ms, p95_ms}} (the latency of the top-k requests alone); `pool`: also
    ask each question for the pool (a second request per question and mode)."""
    modes = list(modes)
    sums: dict[tuple[str, Any], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    pools: dict[tuple[str, Any], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])  # any@50, any@100
    lat: dict[str, list[float]] = collections.defaultdict(list)
    stage_ms: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    stopped: collections.Counter[str] = collections.Counter()  # answers whose rerank the budget cut short

    def add(system: str, cat: int, m: tuple[float, float, float]) -> None:
        for key in ((system, CATEGORIES[cat]), (system, "all")):
            v = sums[key]
            v[0], v[1], v[2], v[3] = v[0] + m[0], v[1] + m[1], v[2] + m[2], v[3] + 1

    for conv, d in convs.items():
        ts = turns(d)
        refs = [t["dia_id"] for t in ts]
        bm = BM25([f"{t['speaker']}: {t['text']}" for t in ts])
        for qa in questions(d):
            ev = [e.strip() for e in qa["evidence"]]
            add(BASELINE, qa["category"], metrics([refs[i] for i in bm.top(qa["question"], k)], ev, k))
            for mode in modes:
                body: dict[str, Any] = {"tenant": tenant(conv), "query": qa["question"], "top_k": k}
                if mode != "auto":
                    body["mode"] = mode
                t0 = time.perf_counter()
                r = client.post("/v1/recall", json=body)
                lat[mode].append((time.perf_counter() - t0) * 1000)
                hits = r.json().get("hits", []) if r.status_code == 200 else []
                trace = r.json().get("trace", {}) if r.status_code == 200 else {}
                for stage, ms in {**trace.get("stages_ms", {}), "total": trace.get("total_ms")}.items():
                    if ms is not None:
                        stage_ms[mode][stage].append(ms)
                stopped[mode] += (trace.get("rerank") or {}).get("stopped") == "budget"  # a reason runs differ
                add(
                    f"ledger:{mode}", qa["category"], metrics([(h.get("source") or {}).get("ref") for h in hits], ev, k)
                )
                if not pool:
                    continue
                r = client.post("/v1/recall", json={**body, "top_k": 100, "rerank": False})
                r.raise_for_status()  # a refused pool request is a broken measurement, not a miss
                pooled = [(h.get("source") or {}).get("ref") for h in r.json().get("hits", [])]
                for key in ((f"ledger:{mode}", CATEGORIES[qa["category"]]), (f"ledger:{mode}", "all")):
                    pools[key][0] += metrics(pooled, ev, 50)[0]
                    pools[key][1] += metrics(pooled, ev, 100)[0]
            if progress:
                progress(1)
    systems: dict[str, dict[str, dict[str, float]]] = collections.defaultdict(dict)
    for (system, cat), (a, f, rr, n) in sums.items():
        systems[system][cat] = {"n": int(n), "any": round(a / n, 3), "frac": round(f / n, 3), "mrr": round(rr / n, 3)}
        if (system, cat) in pools:
            p50, p100 = pools[(system, cat)]
            systems[system][cat].update(pool50=round(p50 / n, 3), pool100=round(p100 / n, 3))
    latency = {m: {"p50_ms": _pct(ls, 0.5), "p95_ms": _pct(ls, 0.95)} for m, ls in lat.items()}
    # where the server's time went, per mode: each stage's p50 / p95 over the questions that ran it
    stages = {
        m: {st: {"n": len(xs), "p50_ms": _pct(xs, 0.5), "p95_ms": _pct(xs, 0.95)} for st, xs in by.items()}
        for m, by in stage_ms.items()
    }
    budget = {m: stopped[m] for m in modes}
    return {"k": k, "systems": dict(systems), "latency": latency, "stages": stages, "rerank_budget_stops": budget}


def table_rows(result: dict[str, Any]) -> list[str]:
    """Markdown rows: one per system and category, all first; latency beside each mode's `all` row."""
    order = [BASELINE, *(f"ledger:{m}" for m in MODES)]
    rows = [
        "| system | category | n | any@k | frac@k | MRR@k | pool any@50 | pool any@100 | p50 ms | p95 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system in order:
        cats = result["systems"].get(system)
        if not cats:
            continue
        lat = result["latency"].get(system.removeprefix("ledger:"), {})
        for cat in ("all", *CATEGORIES.values()):
            if cat not in cats:
                continue
            v = cats[cat]
            p50, p95 = (lat.get("p50_ms"), lat.get("p95_ms")) if cat == "all" else ("", "")
            label = f"**{system}**" if cat == "all" else system
            pool = " | ".join(f"{v[p]:.3f}" if p in v else "" for p in ("pool50", "pool100"))
            rows.append(
                f"| {label} | {cat} | {v['n']} | {v['any']:.3f} | {v['frac']:.3f} | {v['mrr']:.3f} | {pool} | "
                f"{'' if p50 is None else p50} | {'' if p95 is None else p95} |"
            )
    return rows


def stage_rows(result: dict[str, Any]) -> list[str]:
    """Markdown rows: per mode, each server stage's p50 / p95 ms (the trace's `stages_ms`, `total` its whole)."""
    stages = result.get("stages", {})
    if not stages:
        return []
    rows = ["| mode | server stage | questions | p50 ms | p95 ms |", "|---|---|---|---|---|"]
    for mode, by in stages.items():
        for stage, v in sorted(by.items(), key=lambda kv: (kv[0] == "total", -(kv[1]["p50_ms"] or 0))):
            rows.append(f"| {mode} | {stage} | {v['n']} | {v['p50_ms']} | {v['p95_ms']} |")
        stops = result.get("rerank_budget_stops", {}).get(mode)
        if stops is not None:
            rows.append(f"| {mode} | rerank cut short by its budget | {stops} | | |")
    return rows


SECTION = "## Conversational recall on the dev set"


def _recording_note(recording: bool | None) -> str:
    """What the section says of access recording (None: a running service, whose setting the bench cannot see)."""
    if recording is None:
        return ""
    if recording:
        return " The API recorded what it served (earlier answers may reorder later ties)."
    return " The API recorded no accesses: every question asked the same ledger."


def write_section(md: Path, path: Path, result: dict[str, Any]) -> None:
    """Replace (or append) this benchmark's section of BENCHMARKS.md, below bench/report.py's keep marker."""
    text = md.read_text() if md.exists() else ""
    lines = [
        SECTION,
        "",
        f"`python -m bench conversations` ({path.name}; bench/conversations.py: the shared harness's protocol, "
        f"k={result['k']}, {result.get('turns', '?')} turns, searchable by every stage "
        f"{result.get('searchable_after_s', '?')} s after the last publish). Latency is the client's, over HTTP, "
        "one question at a time, on this 2-core machine shared with other work."
        + _recording_note(result.get("access_recording")),
        "",
        *table_rows(result),
        "",
    ]
    if stages := stage_rows(result):
        lines += ["Where the server's time went (each answer's `trace.stages_ms`):", "", *stages, ""]
    block = "\n".join(lines)
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + block + ("\n" + text[nxt + 1 :] if nxt != -1 else "")  # a blank line before the next
    else:
        text = text.rstrip("\n") + "\n\n" + block
    md.write_text(text)

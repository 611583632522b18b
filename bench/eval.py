"""`python -m bench eval`: storage (L2) and retrieval (L3) quality, as numbers.

L2 storage (read straight from PostgreSQL and Elasticsearch, no labels needed):
  double-active rate, chain completeness, explicit-confidence compliance, orphan rate.
L3 retrieval (over HTTP, POST /v1/recall, the path agents use):
  self-retrieval Recall@1 / Recall@10 over a sample of stored memories, with queries generated
  from the memory itself (its quote = content, and entity + key + value); paraphrase stability
  (every phrasing of bench.dataset.questions_for returns the same top-1 memory_id); exact-hit rate;
  empty-result and false-positive rates on questions nothing answers; and whether a retracted fact
  ever comes back.

Where it runs: L3 needs a running API (`--url`), L2 connects to the stores with the LEDGER_*
settings; both must point at the same schema/index. `--load N` first publishes a bench.dataset of
N events through the SDK and waits until PostgreSQL and Elasticsearch caught up (a worker and an
indexer must be running on the same settings).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from elasticsearch import Elasticsearch
from psycopg.rows import dict_row

from bench.dataset import ATTRIBUTES, questions_for, unanswerable_questions
from producers.settings import Settings
from projections.postgres.connection import connect
from projections.search.ids import doc_ids, tenant_query

__all__ = ["RecallClient", "print_table", "retrieval_quality", "run_eval", "storage_quality", "summary_rows"]

DATASET_KEYS = {a.key for a in ATTRIBUTES}


# --- L2: storage ---------------------------------------------------------------------------------


# The link check looks the successor up in fact_versions itself (its primary key), not in the CTE `f`: against the
# CTE (materialized, no index) it was a nested scan per superseded row, 220+ s at 83k versions in the 100k bench.
_L2_SQL = """
WITH f AS (SELECT * FROM fact_versions WHERE tenant = %(t)s),
chains AS (
  SELECT memory_id,
         min(version) = 1 AND max(version) = count(*) AND count(DISTINCT version) = count(*) AS gap_free
  FROM f GROUP BY memory_id),
bad_links AS (
  SELECT DISTINCT f.memory_id FROM f
  WHERE (f.superseded_by IS NULL) <> (f.superseded_at IS NULL)
     OR (f.status = 'superseded' AND f.superseded_by IS NULL)
     OR (f.superseded_by IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM fact_versions n WHERE n.version_id = f.superseded_by AND n.memory_id = f.memory_id
           AND n.version > f.version))),
doubles AS (
  SELECT memory_id FROM f WHERE status = 'active' AND valid_to IS NULL AND superseded_by IS NULL
  GROUP BY memory_id HAVING count(*) > 1)
SELECT
  (SELECT count(*) FROM chains) AS memories,
  (SELECT count(*) FROM f) AS versions,
  (SELECT count(*) FROM doubles) AS double_active,
  (SELECT count(*) FROM chains c WHERE c.gap_free AND c.memory_id NOT IN (SELECT memory_id FROM bad_links))
    AS complete_chains,
  (SELECT count(*) FROM f WHERE (superseded_by IS NULL) = (superseded_at IS NULL)) AS paired_rows,
  (SELECT count(*) FROM f WHERE source->>'type' = 'explicit') AS explicit_rows,
  (SELECT count(*) FROM f WHERE source->>'type' = 'explicit' AND confidence = 1.0) AS explicit_ok,
  (SELECT count(*) FROM f WHERE status = 'superseded') AS superseded,
  (SELECT count(*) FROM f WHERE status = 'retracted') AS retracted
"""


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 6) if den else None


def storage_quality(settings: Settings, tenant: str) -> dict[str, Any]:
    """L2 numbers for one tenant: all rates in [0, 1]; double-active and orphan rates must be 0."""
    with connect(settings.pg_dsn, settings.pg_schema, autocommit=True) as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(_L2_SQL, {"t": tenant})
            c = cur.fetchone() or {}
        pg_ids = {r[0] for r in conn.execute("SELECT version_id FROM fact_versions WHERE tenant = %s", (tenant,))}
    es = Elasticsearch(settings.es_url, request_timeout=60)
    try:
        es_ids = doc_ids(es, settings.es_index, tenant_query(tenant))
    finally:
        es.close()
    in_es_only, in_pg_only = es_ids - pg_ids, pg_ids - es_ids
    union = len(es_ids | pg_ids)
    return {
        "memories": c.get("memories", 0),
        "versions": c.get("versions", 0),
        "superseded_versions": c.get("superseded", 0),
        "retracted_versions": c.get("retracted", 0),
        "double_active": c.get("double_active", 0),
        "double_active_rate": _rate(c.get("double_active", 0), c.get("memories", 0)),
        "chain_completeness": _rate(c.get("complete_chains", 0), c.get("memories", 0)),
        "superseded_pair_rate": _rate(c.get("paired_rows", 0), c.get("versions", 0)),
        "explicit_confidence_compliance": _rate(c.get("explicit_ok", 0), c.get("explicit_rows", 0)),
        "es_documents": len(es_ids),
        "orphans_in_es": len(in_es_only),
        "unindexed_in_pg": len(in_pg_only),
        "orphan_rate": _rate(len(in_es_only) + len(in_pg_only), union) if union else 0.0,
        "orphan_examples": sorted(in_es_only)[:3] + sorted(in_pg_only)[:3],
    }


# --- L3: retrieval -------------------------------------------------------------------------------


class RecallClient:
    """POST /v1/recall with one keep-alive connection per thread."""

    def __init__(self, url: str, api_key: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.headers = {"X-API-Key": api_key, "Content-Type": "application/json"}
        self.timeout = timeout
        self._clients: dict[int, httpx.Client] = {}

    def _client(self) -> httpx.Client:
        import threading

        tid = threading.get_ident()
        if tid not in self._clients:
            self._clients[tid] = httpx.Client(base_url=self.url, headers=self.headers, timeout=self.timeout)
        return self._clients[tid]

    def recall(self, tenant: str, query: str, *, top_k: int = 10, mode: str = "auto", **extra: Any) -> dict:
        body = {"tenant": tenant, "query": query, "top_k": top_k, "mode": mode, **extra}
        r = self._client().post("/v1/recall", content=orjson.dumps(body))
        if r.status_code != 200:
            raise RuntimeError(f"POST /v1/recall {r.status_code}: {r.text[:300]} (query {query!r})")
        return orjson.loads(r.content)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()


def _sample_memories(settings: Settings, tenant: str, n: int, seed: int) -> list[dict[str, Any]]:
    """n facts that hold now (one row per memory_id), in a reproducible pseudo-random order."""
    query = """
      SELECT * FROM (
        SELECT DISTINCT ON (memory_id) version_id, memory_id, subject, key, value, content, entities, kind
        FROM fact_versions
        WHERE tenant = %(t)s AND valid_from <= now()
          AND (LEAST(valid_to, superseded_at) IS NULL OR LEAST(valid_to, superseded_at) > now())
        ORDER BY memory_id, (kind = 'preference' AND asserted_valid_to IS NOT NULL) DESC, valid_from DESC) cur
      ORDER BY md5(memory_id || %(seed)s) LIMIT %(n)s
    """
    with (
        connect(settings.pg_dsn, settings.pg_schema, autocommit=True) as conn,
        conn.cursor(row_factory=dict_row) as cur,
    ):
        cur.execute(query, {"t": tenant, "n": n, "seed": str(seed)})
        return cur.fetchall()


def _retracted_facts(settings: Settings, tenant: str, n: int, seed: int) -> list[dict[str, Any]]:
    """Facts whose last word is a retraction: nothing about them holds now."""
    query = """
      SELECT memory_id, subject, key, entities FROM fact_versions f
      WHERE tenant = %(t)s AND status = 'retracted' AND key IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM fact_versions g WHERE g.memory_id = f.memory_id
                        AND (LEAST(g.valid_to, g.superseded_at) IS NULL OR LEAST(g.valid_to, g.superseded_at) > now()))
      ORDER BY md5(memory_id || %(seed)s) LIMIT %(n)s
    """
    with (
        connect(settings.pg_dsn, settings.pg_schema, autocommit=True) as conn,
        conn.cursor(row_factory=dict_row) as cur,
    ):
        cur.execute(query, {"t": tenant, "n": n, "seed": str(seed)})
        rows, seen = [], set()
        for r in cur.fetchall():
            if r["memory_id"] not in seen:
                seen.add(r["memory_id"])
                rows.append(r)
        return rows


def _entity(row: dict[str, Any]) -> str:
    return (row.get("entities") or [None])[0] or row["subject"].split(":", 1)[-1]


def _kv_query(row: dict[str, Any]) -> str:
    value = row["value"]
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return f"{_entity(row)} {row['key'].replace('.', ' ').replace('_', ' ')} {text}"


def _ids(res: dict) -> list[str]:
    return [h["memory_id"] for h in res.get("hits", [])]


def _map(fn: Callable[[Any], Any], items: Iterable[Any], threads: int) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, items))


def retrieval_quality(
    client: RecallClient,
    settings: Settings,
    tenant: str,
    *,
    sample: int = 200,
    paraphrase_sample: int = 100,
    unanswerable: int = 50,
    seed: int = 13,
    threads: int = 2,
) -> dict[str, Any]:
    """L3 numbers over HTTP; `examples` keeps a few misses so a drop can be read, not just seen."""
    memories = _sample_memories(settings, tenant, sample, seed)
    queries: list[tuple[str, dict[str, Any], str]] = []
    for m in memories:
        queries.append(("quote", m, m["content"]))
        if m["key"]:
            queries.append(("key_value", m, _kv_query(m)))

    def ask(q: tuple[str, dict[str, Any], str]) -> tuple[str, dict[str, Any], str, dict]:
        return (*q, client.recall(tenant, q[2], top_k=10))

    answered = _map(ask, queries, threads)
    by_type: dict[str, Counter] = {}
    misses: list[dict[str, Any]] = []
    stage_of_hit: Counter = Counter()
    for qtype, m, text, res in answered:
        ids = _ids(res)
        c = by_type.setdefault(qtype, Counter())
        c["n"] += 1
        c["r1"] += bool(ids) and ids[0] == m["memory_id"]
        c["r10"] += m["memory_id"] in ids[:10]
        if ids and ids[0] == m["memory_id"]:
            stage_of_hit[res["hits"][0]["match"]["stage"]] += 1
        elif len(misses) < 8:
            misses.append({"type": qtype, "query": text, "want": m["memory_id"], "got": ids[:3]})
    total = sum(by_type.values(), Counter())
    self_retrieval = {
        "memories": len(memories),
        "queries": total["n"],
        "recall_at_1": _rate(total["r1"], total["n"]),
        "recall_at_10": _rate(total["r10"], total["n"]),
        "by_query_type": {
            t: {"n": c["n"], "recall_at_1": _rate(c["r1"], c["n"]), "recall_at_10": _rate(c["r10"], c["n"])}
            for t, c in sorted(by_type.items())
        },
        "top1_stage": dict(stage_of_hit),
        "misses": misses,
    }

    # paraphrases: every phrasing of a dataset fact
    facts = [m for m in memories if m["key"] in DATASET_KEYS][:paraphrase_sample]
    phrasings = [(m, q) for m in facts for q in questions_for(m["key"], _entity(m))]
    para = _map(lambda mq: (mq[0], mq[1], client.recall(tenant, mq[1], top_k=10)), phrasings, threads)
    top1: dict[str, list[str | None]] = {}
    exact_right = exact_any = wrong_top1 = empty = 0
    para_misses: list[dict[str, Any]] = []
    for m, q, res in para:
        ids = _ids(res)
        top1.setdefault(m["memory_id"], []).append(ids[0] if ids else None)
        stage = res["hits"][0]["match"]["stage"] if ids else None
        exact_any += stage == "exact"
        exact_right += stage == "exact" and ids[0] == m["memory_id"]
        empty += not ids
        if ids and ids[0] != m["memory_id"]:
            wrong_top1 += 1
        if (not ids or ids[0] != m["memory_id"]) and len(para_misses) < 8:
            para_misses.append({"query": q, "want": m["memory_id"], "got": ids[:3], "stage": stage})
    stable = sum(1 for got in top1.values() if len(set(got)) == 1 and got[0] is not None)
    stable_right = sum(1 for mid, got in top1.items() if set(got) == {mid})
    paraphrase = {
        "facts": len(top1),
        "questions": len(para),
        "stability": _rate(stable, len(top1)),
        "stable_and_correct": _rate(stable_right, len(top1)),
        "exact_hit_rate": _rate(exact_right, len(para)),
        "exact_stage_share": _rate(exact_any, len(para)),
        "wrong_top1_rate": _rate(wrong_top1, len(para)),
        "empty_rate": _rate(empty, len(para)),
        "misses": para_misses,
    }

    # questions with no answer
    unans = unanswerable_questions(unanswerable, seed=seed)
    res_u = _map(lambda q: (q, client.recall(tenant, q, top_k=10)), unans, threads)
    fp = [(q, _ids(r)[:2]) for q, r in res_u if _ids(r)]
    retracted = _retracted_facts(settings, tenant, unanswerable, seed)
    res_r = _map(
        lambda f: (
            (f, client.recall(tenant, questions_for(f["key"], _entity(f))[0], top_k=10))
            if f["key"] in DATASET_KEYS
            else (f, {"hits": []})
        ),
        retracted,
        threads,
    )
    resurfaced = sum(1 for f, r in res_r if f["memory_id"] in _ids(r))
    no_answer = {
        "questions": len(unans),
        "empty_rate": _rate(len(unans) - len(fp), len(unans)),
        "false_positive_rate": _rate(len(fp), len(unans)),
        "false_positive_examples": [{"query": q, "got": ids} for q, ids in fp[:5]],
        "retracted_facts_asked": len(res_r),
        "retracted_resurfaced_rate": _rate(resurfaced, len(res_r)),
        "retracted_empty_rate": _rate(sum(1 for _, r in res_r if not _ids(r)), len(res_r)),
    }
    return {"self_retrieval": self_retrieval, "paraphrase": paraphrase, "no_answer": no_answer}


def run_eval(
    settings: Settings,
    url: str,
    api_key: str,
    tenant: str,
    *,
    sample: int = 200,
    paraphrase_sample: int = 100,
    unanswerable: int = 50,
    seed: int = 13,
) -> dict[str, Any]:
    """L2 + L3 for one tenant; the result is plain JSON."""
    t0 = time.perf_counter()
    storage = storage_quality(settings, tenant)
    client = RecallClient(url, api_key)
    try:
        retrieval = retrieval_quality(
            client,
            settings,
            tenant,
            sample=sample,
            paraphrase_sample=paraphrase_sample,
            unanswerable=unanswerable,
            seed=seed,
        )
    finally:
        client.close()
    return {
        "at": datetime.now(UTC).isoformat(),
        "tenant": tenant,
        "pg_schema": settings.pg_schema,
        "es_index": settings.es_index,
        "url": url,
        "seconds": round(time.perf_counter() - t0, 2),
        "storage": storage,
        "retrieval": retrieval,
    }


# --- output --------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, Any, str]]:
    """(layer, metric, value, target) rows for the table and BENCHMARKS.md."""
    s, r = result["storage"], result["retrieval"]
    sr, p, na = r["self_retrieval"], r["paraphrase"], r["no_answer"]
    return [
        ("L2", "double-active rate", s["double_active_rate"], "= 0"),
        ("L2", "chain completeness", s["chain_completeness"], "= 1"),
        ("L2", "superseded_by <=> superseded_at", s["superseded_pair_rate"], "= 1"),
        ("L2", "explicit => confidence 1.0", s["explicit_confidence_compliance"], "= 1"),
        ("L2", "orphan rate (ES vs PG)", s["orphan_rate"], "= 0"),
        ("L3", f"self-retrieval R@1 ({sr['queries']} queries)", sr["recall_at_1"], ">= 0.90"),
        ("L3", "self-retrieval R@10", sr["recall_at_10"], ">= 0.99"),
        *[
            ("L3", f"  {t}: R@1 / R@10", f"{_fmt(v['recall_at_1'])} / {_fmt(v['recall_at_10'])}", "")
            for t, v in sr["by_query_type"].items()
        ],
        ("L3", f"paraphrase stability ({p['facts']} facts)", p["stability"], ""),
        ("L3", "paraphrases all correct", p["stable_and_correct"], ""),
        ("L3", "exact-hit rate (top-1 right, exact stage)", p["exact_hit_rate"], ""),
        ("L3", "wrong top-1 on answerable questions", p["wrong_top1_rate"], ""),
        ("L3", f"empty-result rate, no-answer questions ({na['questions']})", na["empty_rate"], "high"),
        ("L3", "false-positive rate, no-answer questions", na["false_positive_rate"], "low"),
        ("L3", f"retracted fact returned ({na['retracted_facts_asked']} asked)", na["retracted_resurfaced_rate"], "0"),
    ]


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"bench eval: tenant {result['tenant']} ({result['storage']['memories']} memories)")
    for col in ("layer", "metric", "value", "target"):
        t.add_column(col)
    for layer, metric, value, target in summary_rows(result):
        t.add_row(layer, metric, _fmt(value), target)
    Console().print(t)

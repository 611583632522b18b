"""Produce -> queryable lag under a steady load, timed per probe event.

A publisher thread sends background events (another tenant) at a fixed rate and, at a lower
fixed rate, probe events. Each probe is timed from just before it is sent until:
  - `pg`: its version row is readable in PostgreSQL, and
  - `doc`: its document is searchable in Elasticsearch (an ids query on the alias: what recall's stages see), and
  - `recall`: an exact-mode POST /v1/recall returns that very version, and
  - `vector`: its vectors are stored (the embedding stage runs after the document exists; semantic
    recall sees the version once an indexer rewrote its document with them, one outbox batch later).
Two kinds of probes: `update` (a new value of a fact whose entity the tenant already knows,
the common case) and `new` (a fact about an entity never seen before).
`measure_lag_apart` runs all of it as a client process of its own at a lower CPU priority: on a host shared
with the stack, the load and the pollers then take what the stack leaves, as clients on other machines would.
A starved poller can only make a lag look longer (it notes a probe when it gets to look).
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
from elasticsearch import NotFoundError
from psycopg import sql

from bench.dataset import ATTRIBUTES, generate
from bench.latency import percentiles
from infra.procs import launch, terminate
from producers.contract import rfc3339, version_id_for
from producers.sdk import LedgerProducer
from producers.settings import REPO_ROOT, Settings, get_settings
from projections.search.client import es_client

__all__ = ["CLIENT_NICE", "measure_lag", "measure_lag_apart", "probe_seed_events"]

PORT = next(a for a in ATTRIBUTES if a.key == "project.port")
PROBE_TENANT = "bench-probe"
LOAD_TENANT = "bench-load"
CLIENT_NICE = 10  # the load generator's priority in measure_lag_apart, as the embedder's (Settings.embedder_nice)


def _probe_event(entity: str, r: random.Random) -> dict[str, Any]:
    port = r.randint(1025, 65000)
    from datetime import UTC, datetime

    return {
        "event_id": uuid.uuid4().hex,
        "type": "memory.asserted",
        "tenant": PROBE_TENANT,
        "subject": f"project:{entity}",
        "key": PORT.key,
        "value": port,
        "content": PORT.state_zh.format(E=entity, zh=port),
        "entities": [entity],
        "aliases": list(PORT.aliases),
        "source": {"type": "explicit", "service": "bench-lag"},
        "observed_at": rfc3339(datetime.now(UTC)),
    }


def probe_seed_events(n: int = 20, seed: int = 3) -> list[dict[str, Any]]:
    """The facts `update` probes later change: published (and caught up) before the measurement."""
    r = random.Random(seed)
    return [_probe_event(f"LAG{i}", r) for i in range(n)]


@dataclass
class _Probe:
    kind: str
    event_id: str
    entity: str
    sent: float
    pg: float | None = None
    doc: float | None = None
    recall: float | None = None
    vector: float | None = None


@dataclass
class _State:
    probes: list[_Probe] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    failed: list[str] = field(default_factory=list)  # a poller that died: its probes' lag would read as never seen

    def pending(self, attr: str) -> list[_Probe]:
        with self.lock:
            return [p for p in self.probes if getattr(p, attr) is None]


def _publisher(settings: Settings, rate: float, duration: float, probe_rate: float, st: _State, out: dict) -> None:
    r = random.Random(17)
    # the dataset's steady mix: skip the generator's opening phase (one first assertion per subject, 100% embeddings)
    subjects = 200
    load = itertools.islice(
        generate(int(rate * duration) + 100 + subjects, subjects, seed=99, tenants=(LOAD_TENANT,)), subjects, None
    )
    seeded = itertools.cycle(range(len(probe_seed_events())))
    new_ids = itertools.count()
    sent_load = sent_probes = 0
    with LedgerProducer(settings, linger_ms=1) as producer:
        t0 = time.perf_counter()
        while (now := time.perf_counter() - t0) < duration:
            due = int(now * rate) - sent_load
            if due > 0:
                batch = list(itertools.islice(load, due))
                producer.publish_many(batch)
                sent_load += len(batch)
            if now * probe_rate >= sent_probes:
                kind = "update" if sent_probes % 2 == 0 else "new"
                entity = (
                    f"LAG{next(seeded)}" if kind == "update" else f"LN{1000 + next(new_ids)}"
                )  # id-shaped, as in the data
                ev = _probe_event(entity, r)
                p = _Probe(kind, ev["event_id"], entity, time.perf_counter())
                with st.lock:
                    st.probes.append(p)
                producer.publish(ev)
                sent_probes += 1
            time.sleep(0.01)
        out["seconds"] = time.perf_counter() - t0
        out["load_events"] = sent_load
        out["probes"] = sent_probes


def _pg_poller(settings: Settings, st: _State, deadline: list[float]) -> None:
    """When each probe's version row is in PostgreSQL, asked by its primary key (an ask by event id would scan the
    table every 5 ms, and the measurement would load the server it measures)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        q = sql.SQL("SELECT version_id FROM {} WHERE version_id = ANY(%s)").format(
            sql.Identifier(settings.pg_schema, "fact_versions")
        )
        while not (st.done.is_set() and not st.pending("pg")) and time.perf_counter() < deadline[0]:
            pending = {version_id_for(PROBE_TENANT, p.event_id): p for p in st.pending("pg")}
            if pending:
                seen = {row[0] for row in conn.execute(q, (list(pending),))}
                t = time.perf_counter()
                for vid in seen:
                    pending[vid].pg = t
            time.sleep(0.005)


def _vector_poller(settings: Settings, st: _State, deadline: list[float]) -> None:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        q = sql.SQL("SELECT DISTINCT version_id FROM {} WHERE version_id = ANY(%s)").format(
            sql.Identifier(settings.pg_schema, "version_vectors")
        )
        while not (st.done.is_set() and not st.pending("vector")) and time.perf_counter() < deadline[0]:
            pending = {version_id_for(PROBE_TENANT, p.event_id): p for p in st.pending("vector")}
            if pending:
                seen = {row[0] for row in conn.execute(q, (list(pending),))}
                t = time.perf_counter()
                for vid in seen:
                    pending[vid].vector = t
            time.sleep(0.02)


def _doc_poller(settings: Settings, st: _State, deadline: list[float]) -> None:
    """When each probe's document is searchable: recall's `doc` lag minus this is the API's own share."""
    with es_client(settings, request_timeout=10) as es:
        while not (st.done.is_set() and not st.pending("doc")) and time.perf_counter() < deadline[0]:
            pending = {version_id_for(PROBE_TENANT, p.event_id): p for p in st.pending("doc")}
            if pending:
                try:
                    ids = {"ids": {"values": list(pending)}}
                    res = es.search(index=settings.es_index, query=ids, size=len(pending), source=False)
                except NotFoundError:  # the indexer has not created the index yet: nothing is searchable
                    res = {"hits": {"hits": []}}
                t = time.perf_counter()
                for h in res["hits"]["hits"]:
                    pending[h["_id"]].doc = t
            time.sleep(0.01)


def _recall_poller(url: str, api_key: str, st: _State, deadline: list[float]) -> None:
    headers = {"X-API-Key": api_key, "Content-Type": "application/json"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        while not (st.done.is_set() and not st.pending("recall")) and time.perf_counter() < deadline[0]:
            pending = st.pending("recall")
            for p in pending:
                body = {"tenant": PROBE_TENANT, "query": f"{p.entity} 后端端口", "mode": "exact", "top_k": 3}
                r = client.post("/v1/recall", content=orjson.dumps(body))
                wanted = version_id_for(PROBE_TENANT, p.event_id)
                if r.status_code == 200 and any(h["version_id"] == wanted for h in orjson.loads(r.content)["hits"]):
                    p.recall = time.perf_counter()
            time.sleep(0.02)  # a poll round every ~20 ms: fine enough, without starving the indexer of CPU


def _guarded(st: _State, poll: Callable[..., None], *args: Any) -> None:
    """Run one poller; if it dies, say so in `st` (the measurement then fails instead of reporting fewer probes)."""
    try:
        poll(*args)
    except Exception as exc:
        st.failed.append(f"{poll.__name__}: {type(exc).__name__}: {exc}")
        raise


def measure_lag(
    settings: Settings, url: str, api_key: str, rate: float, *, duration: float = 30.0, probe_rate: float = 2.0
) -> dict[str, Any]:
    """Steady load at `rate` events/s for `duration` s; per-probe lag to PG, to an exact recall and to its vectors."""
    st = _State()
    pub: dict[str, Any] = {}
    deadline = [time.perf_counter() + duration + 120]
    pollers: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (_pg_poller, (settings, st, deadline)),
        (_doc_poller, (settings, st, deadline)),
        (_recall_poller, (url, api_key, st, deadline)),
        (_vector_poller, (settings, st, deadline)),
    ]
    threads = [threading.Thread(target=_guarded, args=(st, fn, *args), daemon=True) for fn, args in pollers]
    for t in threads:
        t.start()
    _publisher(settings, rate, duration, probe_rate, st, pub)
    st.done.set()
    for t in threads:
        t.join(timeout=130)
    if st.failed:
        raise RuntimeError(f"a lag poller died: {'; '.join(st.failed)}")
    out: dict[str, Any] = {
        "target_rate_per_s": round(rate, 1),
        "achieved_rate_per_s": round((pub["load_events"] + pub["probes"]) / pub["seconds"], 1),
        "duration_s": round(pub["seconds"], 1),
        "probes": pub["probes"],
    }
    for kind in ("all", "update", "new"):
        ps = [p for p in st.probes if kind == "all" or p.kind == kind]
        out[kind] = {
            "pg": percentiles([(p.pg - p.sent) * 1000 for p in ps if p.pg is not None]),
            "doc": percentiles([(p.doc - p.sent) * 1000 for p in ps if p.doc is not None]),
            "recall": percentiles([(p.recall - p.sent) * 1000 for p in ps if p.recall is not None]),
            "vector": percentiles([(p.vector - p.sent) * 1000 for p in ps if p.vector is not None]),
            "never_seen_pg": sum(p.pg is None for p in ps),
            "never_seen_doc": sum(p.doc is None for p in ps),
            "never_seen_recall": sum(p.recall is None for p in ps),
            "never_seen_vector": sum(p.vector is None for p in ps),
        }
    return out


def measure_lag_apart(
    settings: Settings,
    url: str,
    api_key: str,
    rate: float,
    *,
    duration: float = 30.0,
    probe_rate: float = 2.0,
    log_dir: Path,
    nice: int = CLIENT_NICE,
) -> dict[str, Any]:
    """`measure_lag` in a process of its own session at `nice` (its autogroup too: infra.procs.launch), with
    `settings` passed as its environment; the child's result, or RuntimeError naming its log."""
    with tempfile.TemporaryDirectory(prefix="bench-lag-") as tmp:
        out = Path(tmp) / "lag.json"
        cmd = [sys.executable, "-m", "bench.lag", url, str(rate), str(duration), str(probe_rate), str(out)]
        env = {**settings.child_environ(), "BENCH_LAG_API_KEY": api_key}
        log = log_dir / "lag-client.log"
        proc = launch(cmd, log, env, REPO_ROOT, nice=nice)
        try:
            returncode = proc.wait()
        finally:  # interrupted: the client, in a session of its own, would load the stack on without us
            terminate(proc, 5, group=True)
        if returncode != 0 or not out.exists():
            raise RuntimeError(f"the lag client exited {returncode} (log: {log})")
        return orjson.loads(out.read_bytes())


if __name__ == "__main__":  # measure_lag_apart's child: url rate duration probe_rate out
    url, rate, duration, probe_rate, out = sys.argv[1:6]
    result = measure_lag(
        get_settings(),
        url,
        os.environ["BENCH_LAG_API_KEY"],
        float(rate),
        duration=float(duration),
        probe_rate=float(probe_rate),
    )
    Path(out).write_bytes(orjson.dumps(result))

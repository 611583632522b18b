"""`ledger demo`: publish a few bilingual facts over HTTP, update one, and show recall explaining itself.

Talks to a running service only through its HTTP API (`python -m infra up --service`),
exactly as a client service would.
"""

from __future__ import annotations

import time
import uuid

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from producers.settings import get_settings

console = Console(width=160)

FACTS = [
    {
        "subject": "project:P1",
        "key": "project.port",
        "value": 8080,
        "content": "项目 P1 的后端服务端口是 8080",
        "entities": ["P1"],
        "aliases": ["后端服务地址", "后端端口", "端口", "backend port", "port"],
    },
    {
        "subject": "user:42",
        "key": "preference.seat",
        "kind": "preference",
        "value": "window",
        "content": "User 42 prefers window seats on flights",
        "aliases": ["seat preference", "座位偏好", "靠窗"],
    },
    {
        "subject": "user:42",
        "key": "preference.answer_style",
        "kind": "preference",
        "value": "concise",
        "content": "用户 42 喜欢简洁的回答",
        "aliases": ["回答风格", "answer style"],
    },
    {
        "subject": "order:OD20241102",
        "key": "order.status",
        "value": "refunded",
        "content": "订单 OD20241102 已退款 (order OD20241102 was refunded)",
        "entities": ["OD20241102"],
        "aliases": ["订单状态", "order status", "退款"],
    },
]

QUESTIONS = [
    "P1 的后端服务端口是多少",
    "what port does the P1 backend use?",
    "does user 42 like the aisle or the window?",
    "OD20241102 退款了吗",
    "今天中午吃什么",
]


def _event(tenant: str, fact: dict, **extra) -> dict:
    return {
        "event_id": uuid.uuid4().hex,
        "type": "memory.asserted",
        "tenant": tenant,
        "source": {"type": "explicit", "service": "demo", "ref": "demo-session-1"},
        **fact,
        **extra,
    }


def _wait_for(client: httpx.Client, tenant: str, subject: str, key: str, value, timeout: float = 60.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        resp = client.get(f"/v1/subjects/{subject}/facts", params={"tenant": tenant})
        if resp.status_code == 200 and any(f["key"] == key and f["value"] == value for f in resp.json()["facts"]):
            return time.monotonic() - t0
        time.sleep(0.1)
    raise TimeoutError(f"{subject} {key}={value!r} not visible after {timeout}s")


def _wait_indexed(client: httpx.Client, tenant: str, query: str, value, timeout: float = 60.0) -> float:
    """Poll until the search index answers `query` exactly with `value` (the outbox drained and refreshed)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        body = client.post("/v1/recall", json={"tenant": tenant, "query": query, "mode": "exact"}).json()
        if any(h["value"] == value for h in body.get("hits", [])):
            return time.monotonic() - t0
        time.sleep(0.1)
    raise TimeoutError(f"the search index did not answer {query!r} with {value!r} after {timeout}s")


def run(base_url: str | None = None, api_key: str = "dev-key", tenant: str | None = None) -> None:
    s = get_settings()
    tenant = tenant or "demo"
    url = base_url or f"http://{s.api_host}:{s.api_port}"
    with httpx.Client(base_url=url, headers={"X-API-Key": api_key}, timeout=30) as client:
        console.rule("[bold]1. publish four facts (Chinese and English)")
        resp = client.post("/v1/events", json={"events": [_event(tenant, f) for f in FACTS]})
        resp.raise_for_status()
        for r in resp.json()["results"]:
            console.print(f"  accepted={r['accepted']} partition={r.get('partition')} offset={r.get('offset')}")
        lag = _wait_for(client, tenant, "project:P1", "project.port", 8080)
        console.print(f"  visible in PostgreSQL after {lag * 1000:.0f} ms")

        console.rule("[bold]2. the port of P1 changes: 8080 -> 9090")
        update = _event(tenant, {**FACTS[0], "value": 9090, "content": "项目 P1 的后端服务端口改为 9090"})
        client.post("/v1/events", json={"events": [update]}).raise_for_status()
        _wait_for(client, tenant, "project:P1", "project.port", 9090)
        facts = client.get("/v1/subjects/project:P1/facts", params={"tenant": tenant}).json()["facts"]
        memory_id = next(f["memory_id"] for f in facts if f["key"] == "project.port")
        history = client.get(f"/v1/facts/{memory_id}/history", params={"tenant": tenant}).json()["versions"]
        table = Table("version", "value", "status", "valid_from", "superseded_by")
        for v in history:
            table.add_row(str(v["version"]), str(v["value"]), v["status"], v["valid_from"], str(v["superseded_by"]))
        console.print(table)
        lag = _wait_indexed(client, tenant, "P1 port", 9090)
        console.print(f"  the update is searchable {lag * 1000:.0f} ms after it was visible in PostgreSQL")

        console.rule("[bold]3. recall: deterministic first, each hit says why")
        for q in QUESTIONS:
            body = client.post("/v1/recall", json={"tenant": tenant, "query": q, "top_k": 3}).json()
            console.print(f"[bold cyan]Q:[/] {q}")
            console.print(f"   cues: {orjson.dumps(body.get('cues')).decode()}")
            trace = body.get("trace", {})
            console.print(f"   trace: {orjson.dumps(trace).decode()}")
            if not body.get("hits"):
                console.print("   [yellow]no memory answers this[/] (an empty answer, never a made-up one)")
            for h in body.get("hits", []):
                m = h["match"]
                console.print(
                    f"   [green]{m['stage']}[/] {h['subject']} {h['key']} = {h['value']!r} "
                    f"(v{h['version']}, {h['status']}) score={h['score']:.3f} cues={m.get('cues')}  «{h['content']}»"
                )
        console.rule("[bold]done")
        console.print(f"The service keeps running at {url} (API key {api_key!r}); `make down` stops everything.")

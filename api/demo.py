"""`ledger demo`: publish a few bilingual facts over HTTP, update one, and show recall explaining itself.

Talks to a running service only through its HTTP API (`python -m infra up --service`), exactly as a client service
would: each read carries the consistency token of the writes before it, so it answers once they are readable
(on a stack just started the search index may take seconds to catch up), and a `not_yet` is retried.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from producers.consistency import merge_tokens
from producers.retry import retry
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


class _NotYet(Exception):
    """The service has not caught up with the token yet (503 `not_yet`): the same read, asked again, will answer."""


def _read(client: httpx.Client, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
    """The answer of a read carrying `after`, asked again while the service says `not_yet` (each ask waits a bounded
    time on the server; a stack just started may need several)."""

    def once() -> dict[str, Any]:
        resp = client.request(method, url, **kwargs)
        if resp.status_code == 503 and any(d.get("code") == "not_yet" for d in resp.json().get("detail", [])):
            raise _NotYet(resp.text)
        resp.raise_for_status()
        return resp.json()

    return retry(once, attempts=20, retry_on=(_NotYet,), step_s=0.1)


def _publish(client: httpx.Client, events: list[dict]) -> dict[str, Any]:
    resp = client.post("/v1/events", json={"events": events})
    resp.raise_for_status()
    return resp.json()


def run(base_url: str | None = None, api_key: str = "dev-key", tenant: str | None = None) -> dict[str, list[Any]]:
    """Run the demo against the service at `base_url`; each question's hit values (what it printed)."""
    s = get_settings()
    tenant = tenant or "demo"
    url = base_url or f"http://{s.api_host}:{s.api_port}"
    answers: dict[str, list[Any]] = {}
    with httpx.Client(base_url=url, headers={"X-API-Key": api_key}, timeout=30) as client:
        console.rule("[bold]1. publish four facts (Chinese and English)")
        t0 = time.monotonic()
        wrote = _publish(client, [_event(tenant, f) for f in FACTS])
        for r in wrote["results"]:
            console.print(f"  accepted={r['accepted']} partition={r.get('partition')} offset={r.get('offset')}")
        facts_of_p1 = {"tenant": tenant, "after": wrote["consistency_token"]}
        _read(client, "GET", "/v1/subjects/project:P1/facts", params=facts_of_p1)
        console.print(f"  visible in PostgreSQL {(time.monotonic() - t0) * 1000:.0f} ms after the publish")

        console.rule("[bold]2. the port of P1 changes: 8080 -> 9090")
        update = _event(tenant, {**FACTS[0], "value": 9090, "content": "项目 P1 的后端服务端口改为 9090"})
        token = merge_tokens(wrote["consistency_token"], _publish(client, [update])["consistency_token"])
        facts = _read(client, "GET", "/v1/subjects/project:P1/facts", params={"tenant": tenant, "after": token})
        visible = time.monotonic()
        # keyword recall needs the documents indexed: the same token, read by a stage that waits for the index
        ask = {"tenant": tenant, "query": "P1 port", "mode": "keyword", "after": token}
        _read(client, "POST", "/v1/recall", json=ask)
        searchable = (time.monotonic() - visible) * 1000
        memory_id = next(f["memory_id"] for f in facts["facts"] if f["key"] == "project.port")
        history = client.get(f"/v1/facts/{memory_id}/history", params={"tenant": tenant}).json()["versions"]
        table = Table("version", "value", "status", "valid_from", "superseded_by")
        for v in history:
            table.add_row(str(v["version"]), str(v["value"]), v["status"], v["valid_from"], str(v["superseded_by"]))
        console.print(table)
        console.print(f"  the update is searchable {searchable:.0f} ms after it was visible in PostgreSQL")

        console.rule("[bold]3. recall: deterministic first, each hit says why")
        for q in QUESTIONS:
            body = _read(client, "POST", "/v1/recall", json={"tenant": tenant, "query": q, "top_k": 3, "after": token})
            console.print(f"[bold cyan]Q:[/] {q}")
            console.print(f"   cues: {orjson.dumps(body.get('cues')).decode()}")
            trace = body.get("trace", {})
            console.print(f"   trace: {orjson.dumps(trace).decode()}")
            answers[q] = [h["value"] for h in body.get("hits", [])]
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
    return answers

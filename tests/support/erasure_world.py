"""The audit console's Erasures view's world: encryption on, subjects erased, their erasure records complete.

`erasure_settings(base, name)` is `base.private(name)` with encryption on, a fresh key-encryption key and the
world's API keys. `erasure_world(settings)` publishes `scenario()` through the SDK, runs the worker and the indexer
(`pipeline`), serves the API with `uvicorn api.main:app` (`ApiServer`), then erases through it: `GONE` in tenant
`acme` (`DELETE /v1/subjects/...`, the auditor's key) and `FOREIGN_GONE` in tenant `globex` (globex's key), and
publishes one erasure with a hostile event id for the hostile subject `HOSTILE_SUBJECT` through the SDK. It yields
once every erasure record is complete (the indexer purged the search index), so what the API answers is final.
Used by tests/test_console_erasures.py and the screenshot script (`python -m tests.support.shoot_console`).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr

from producers.contract import MemoryEvent
from producers.settings import Settings
from tests.support.browser import ApiServer
from tests.support.events import asserted, erased
from tests.support.pipeline import Pipeline, pipeline
from tests.support.waiting import wait_for

__all__ = [
    "AUDITOR_KEY",
    "ERASURE_KEYS",
    "FOREIGN",
    "FOREIGN_GONE",
    "FOREIGN_KEY",
    "GONE",
    "HOSTILE_ERASURE",
    "HOSTILE_SUBJECT",
    "KEPT",
    "TENANT",
    "ErasureWorld",
    "erasure_settings",
    "erasure_world",
    "scenario",
]

AUDITOR_KEY, FOREIGN_KEY = "erasure-auditor-key", "erasure-globex-key"
TENANT, FOREIGN = "acme", "globex"
ERASURE_KEYS = {AUDITOR_KEY: [TENANT], FOREIGN_KEY: [FOREIGN]}
GONE, KEPT, FOREIGN_GONE = "user:erase-me", "user:keep-me", "user:globex-gone"
HOSTILE_SUBJECT = "<script>window.__pwned=1</script><b>user</b>"
HOSTILE_ERASURE = "<img src=x onerror=window.__pwned=2>"  # no "/": an erasure id is one path segment


def erasure_settings(base: Settings, name: str) -> Settings:
    """`base` on private names `name`, with encryption on, a new key-encryption key and the world's API keys."""
    kek = SecretStr(base64.b64encode(os.urandom(32)).decode())
    return base.private(name, encryption="on", kek=kek, api_keys=ERASURE_KEYS)


def scenario() -> list[MemoryEvent]:
    """The facts published before any erasure (each subject gets its data key from the SDK)."""
    return [
        asserted(GONE, "pref.seat", "window", 0, content="user erase-me prefers window seats"),
        asserted(GONE, "home.city", "Lyon", 1, content="user erase-me lives in Lyon"),
        asserted(GONE, "pref.seat", "aisle", 2, content="user erase-me now prefers aisle seats"),
        asserted(KEPT, "pref.seat", "middle", 0, content="user keep-me prefers middle seats"),
        asserted(HOSTILE_SUBJECT, "note", "<b>bold</b>", 0, content="a hostile subject's note"),
        asserted(FOREIGN_GONE, "pref.seat", "globex-only", 0, tenant=FOREIGN, content="globex's own user"),
        asserted(FOREIGN_GONE, "home.city", "Oslo", 1, tenant=FOREIGN, content="globex's user lives in Oslo"),
    ]


@dataclass
class ErasureWorld:
    settings: Settings
    pipe: Pipeline
    api: ApiServer
    erasures: dict[str, str]  # GONE / HOSTILE_SUBJECT / FOREIGN_GONE -> its erasure id

    @property
    def url(self) -> str:
        return self.api.url

    def get(self, path: str, key: str = AUDITOR_KEY, status: int = 200, **params: Any) -> dict[str, Any]:
        """GET `path` from the API with `key`; the JSON body (asserting the status)."""
        r = httpx.get(self.url + path, params=params, headers={"X-API-Key": key}, timeout=60)
        assert r.status_code == status, r.text
        return r.json()


def _erase(url: str, key: str, tenant: str, subject: str) -> str:
    r = httpx.delete(f"{url}/v1/subjects/{subject}", params={"tenant": tenant}, headers={"X-API-Key": key}, timeout=60)
    assert r.status_code == 202, r.text
    return r.json()["event_id"]


@contextmanager
def erasure_world(settings: Settings) -> Iterator[ErasureWorld]:
    """`scenario()` applied on `settings` (see erasure_settings), three subjects erased, every record complete."""
    with pipeline(settings, seed=scenario()) as pipe, ApiServer(settings) as api:
        api.wait_ready()
        ids = {GONE: _erase(api.url, AUDITOR_KEY, TENANT, GONE)}
        ids[FOREIGN_GONE] = _erase(api.url, FOREIGN_KEY, FOREIGN, FOREIGN_GONE)
        pipe.publish([erased(HOSTILE_SUBJECT, tenant=TENANT, event_id=HOSTILE_ERASURE)])
        ids[HOSTILE_SUBJECT] = HOSTILE_ERASURE
        pipe.settle()
        world = ErasureWorld(settings, pipe, api, ids)
        for subject, erasure_id in ids.items():
            tenant, key = (FOREIGN, FOREIGN_KEY) if subject == FOREIGN_GONE else (TENANT, AUDITOR_KEY)

            def complete(tenant: str = tenant, key: str = key, erasure_id: str = erasure_id) -> bool:
                r = httpx.get(
                    f"{api.url}/v1/erasures/{erasure_id}",
                    params={"tenant": tenant},
                    headers={"X-API-Key": key},
                    timeout=30,
                )
                return r.status_code == 200 and r.json()["complete"]

            wait_for(complete, 90, 0.3, f"the erasure record {erasure_id!r} to be complete")
        yield world

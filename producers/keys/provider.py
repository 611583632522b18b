"""Where a producer gets a subject's data key: the key store itself, or the API for services without its credentials.

Both sit behind `SealingKeys.sealing_keys(pairs)` and a bounded cache (`CachedKeys`: `key_cache_size` subjects,
each kept `key_cache_ttl_s`): a burst of events about one subject asks once. `RemoteKeys` asks
`POST /v1/keys` with an API key (which tenants it may ask for is the API's rule, as for every route), so a
service that publishes needs Kafka and an API key, never PostgreSQL credentials or the KEK.

A process that publishes an erasure retires the subject's key at the source and in its own cache; the API and
the MCP server also drop a tenant's cached keys when the key store or the projection notifies an erasure of one of
its subjects (`forget_tenant`). Any other process's cached key outlives the erasure by at most the TTL: an event it
seals with that key after the erasure cannot be opened once the key is destroyed (the worker dead-letters it as
`key_destroyed`), so keep the TTL short where subjects are erased and re-created.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

import httpx
import psycopg

from producers.keys.envelope import DataKey
from producers.keys.kek import KekError
from producers.keys.store import KeyStore, settings_keks
from producers.settings import Settings

__all__ = ["CachedKeys", "KeyServiceError", "RemoteKeys", "SealingKeys", "sealing_keys_for"]

Pair = tuple[str, str]

log = logging.getLogger(__name__)


class KeyServiceError(RuntimeError):
    """The key service (the store or the API) did not hand out a data key: nothing is published unsealed.
    `refused`: the key endpoint answered and said no (a key it does not know, a tenant the key may not use, a
    request it rejects): asking again changes nothing, unlike an endpoint away or busy."""

    def __init__(self, message: str, *, refused: bool = False, store: str = "api") -> None:
        super().__init__(message)
        self.refused = refused
        self.store = store  # api: the key endpoint; keys: the key source answered without every key asked for


def _answered(response: httpx.Response) -> KeyServiceError:
    """The error of a key endpoint's answer other than 200: a refusal for a 4xx but a timeout or a rate limit."""
    refused = 400 <= response.status_code < 500 and response.status_code not in (408, 429)
    return KeyServiceError(f"the key endpoint answered {response.status_code}: {response.text[:300]}", refused=refused)


class SealingKeys(Protocol):
    def sealing_keys(self, pairs: Iterable[Pair]) -> dict[Pair, DataKey]: ...

    def retire(self, tenant: str, subject: str, erasure_id: str) -> int: ...

    def close(self) -> None: ...


class RemoteKeys:
    """Data keys from the API's `POST /v1/keys` ({"tenant", "subjects"} -> {"keys": [{subject, key_id, key}]})."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float = 10.0) -> None:
        headers = {"X-API-Key": api_key} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def sealing_keys(self, pairs: Iterable[Pair]) -> dict[Pair, DataKey]:
        by_tenant: dict[str, list[str]] = {}
        for tenant, subject in pairs:
            by_tenant.setdefault(tenant, []).append(subject)
        out: dict[Pair, DataKey] = {}
        for tenant, subjects in by_tenant.items():
            for start in range(0, len(subjects), 500):
                chunk = subjects[start : start + 500]
                try:
                    response = self._http.post("/v1/keys", json={"tenant": tenant, "subjects": chunk})
                except httpx.HTTPError as exc:
                    raise KeyServiceError(f"the key endpoint did not answer: {type(exc).__name__}: {exc}") from exc
                if response.status_code != 200:
                    raise _answered(response)
                for item in response.json()["keys"]:
                    out[(tenant, item["subject"])] = DataKey(item["key_id"], base64.b64decode(item["key"]))
        return out

    def retire(self, tenant: str, subject: str, erasure_id: str) -> int:
        try:
            response = self._http.post(
                "/v1/keys/retire", json={"tenant": tenant, "subject": subject, "erasure_id": erasure_id}
            )
        except httpx.HTTPError as exc:
            raise KeyServiceError(f"the key endpoint did not answer: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise _answered(response)
        return int(response.json()["retired"])

    def close(self) -> None:
        self._http.close()


class CachedKeys:
    """A bounded, time-limited cache in front of another SealingKeys (thread-safe)."""

    def __init__(self, inner: SealingKeys, *, size: int, ttl_s: float) -> None:
        self.inner, self.size, self.ttl_s = inner, max(0, size), ttl_s
        self._cache: OrderedDict[Pair, tuple[float, DataKey]] = OrderedDict()
        self._lock = threading.Lock()

    def sealing_keys(self, pairs: Iterable[Pair]) -> dict[Pair, DataKey]:
        wanted = list(dict.fromkeys(pairs))
        now = time.monotonic()
        out: dict[Pair, DataKey] = {}
        with self._lock:
            for pair in wanted:
                hit = self._cache.get(pair)
                if hit is not None and now - hit[0] < self.ttl_s:
                    out[pair] = hit[1]
        missing = [p for p in wanted if p not in out]
        if missing:
            fetched = self.inner.sealing_keys(missing)
            absent = [p for p in missing if p not in fetched]
            if absent:
                raise KeyServiceError(f"no data key was handed out for {len(absent)} subjects", store="keys")
            out.update(fetched)
            with self._lock:
                for pair in missing:
                    self._cache[pair] = (now, fetched[pair])
                    self._cache.move_to_end(pair)
                while len(self._cache) > self.size:
                    self._cache.popitem(last=False)
        return out

    def forget(self, tenant: str, subject: str) -> None:
        """Drop a subject's cached key: the next event asks for the subject's current key."""
        with self._lock:
            self._cache.pop((tenant, subject), None)

    def forget_tenant(self, tenant: str | None) -> None:
        """Drop the cached keys of `tenant` (None: all): one of its subjects is being erased, maybe by another
        process, which cannot reach this cache but notifies (`producers.keys.store.ERASURE_CHANNEL`)."""
        with self._lock:
            for pair in [p for p in self._cache if tenant is None or p[0] == tenant]:
                del self._cache[pair]

    def retire(self, tenant: str, subject: str, erasure_id: str) -> int:
        """Retire the subject's key at its source and here, before its erasure `erasure_id` is published."""
        self.forget(tenant, subject)
        return self.inner.retire(tenant, subject, erasure_id)

    def close(self) -> None:
        self.inner.close()


def sealing_keys_for(settings: Settings) -> CachedKeys:
    """The producer's key source by configuration: the API (`key_endpoint`) or the store (needs the KEK).

    Raises KekError at once (at start) when the store is used and its KEK is missing or wrong.
    """
    if settings.key_endpoint:
        inner: SealingKeys = RemoteKeys(
            settings.key_endpoint, settings.key_api_key, timeout_s=settings.client_timeout_s
        )
    else:
        keks = settings_keks(settings)
        if keks is None:
            raise KekError(
                "LEDGER_ENCRYPTION is on but no key-encryption key is configured: set LEDGER_KEK or "
                "LEDGER_KEK_FILE (or LEDGER_KEY_ENDPOINT to get data keys from the API)"
            )
        store = KeyStore(settings.pg_dsn, settings.keys_schema, keks, connect_timeout_s=settings.pg_connect_timeout_s)
        try:
            store.check()  # a wrong KEK fails here, at start
        except psycopg.OperationalError as exc:  # the store is down: checked on first use instead (KeyStore)
            log.warning("key store not checked at start (%s): it will be on first use", exc)
        inner = store
    return CachedKeys(inner, size=settings.key_cache_size, ttl_s=settings.key_cache_ttl_s)

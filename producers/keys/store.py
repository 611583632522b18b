"""The key store: data keys per (tenant, subject), wrapped by the KEK, and the erasure records, in PostgreSQL.

Why PostgreSQL: the projection already depends on it, and destroying a key in the *same transaction* as the
purge it completes makes erasure atomic: a worker killed between the purge and the key deletion rolls both back,
and its restart does both. The tables live in `Settings.keys_schema`, beside the projection's schema,
which `ledger rebuild` replaces: a rebuild must find the keys (and the history of erasures) where they were.

Functions taking a cursor run inside the caller's transaction (the recorder's, the indexer's); `KeyStore` is the
producer side (its own connection, get-or-create of sealing keys). Back up this schema with the KEK kept apart:
the key table without the KEK is useless, and the KEK without the table opens nothing.

A subject is named here only by its tenant's keyed digest (`SubjectDigests`: HMAC-SHA256 under a per-tenant random
key kept in `digest_keys`): an erasure record must let whoever knows the subject find it, and must not let anyone
else confirm a guessed id, which an unkeyed hash of a short id allows in well under a second.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any, TypeVar

import orjson
import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from producers.contract import subject_digest_for
from producers.keys.envelope import DataKey, fingerprint_of
from producers.keys.kek import CHECK_PLAINTEXT, KekError, KeyEncryption, load_keks
from producers.settings import Settings

__all__ = [
    "ERASURE_CHANNEL",
    "ErasureRecord",
    "KeyContext",
    "KeyState",
    "KeyStore",
    "SubjectDigests",
    "check_store",
    "destroy_subject_keys",
    "ensure_key_schema",
    "erasure_recorded",
    "key_context",
    "key_states",
    "record_erasure",
    "retire_subject_key",
    "rotate",
    "search_purged",
    "settings_keks",
    "subject_digest",
    "subject_digests",
    "unsealed_warning",
]

# LISTEN for {schema, tenant[, subject]}: a subject of the tenant is being erased (a producer retired its key) or was
# (its erasure committed in the projection): caches of its keys or of what it said are out of date
_T = TypeVar("_T")
ERASURE_CHANNEL = "memory_ledger_erasure"

log = logging.getLogger(__name__)


def _t(schema: str, table: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def ensure_key_schema(conn: psycopg.Connection, schema: str) -> None:
    """Create the key store's schema and tables unless they exist (concurrent starts are serialised)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"schema:{schema}",))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(files("producers.keys").joinpath("schema.sql").read_text())


def _key_aad(key_id: str, tenant: str, digest: str) -> bytes:
    return f"memory-ledger data key\n{key_id}\n{tenant}\n{digest}".encode()


def _check_aad(kek_id: str) -> bytes:
    return f"memory-ledger kek check\n{kek_id}".encode()


def _digest_key_aad(tenant: str) -> bytes:
    return f"memory-ledger subject digest key\n{tenant}".encode()


def subject_digest(key: bytes, tenant: str, subject: str) -> str:
    """The subject's name in the key store: HMAC-SHA256 under its tenant's digest key, hex (64 characters)."""
    return hmac.new(key, orjson.dumps([tenant, subject]), hashlib.sha256).hexdigest()


def subject_digests(key: bytes | None, tenant: str, subject: str) -> list[str]:
    """Every digest the store may hold for the subject: the keyed one, and the unkeyed one of rows written before."""
    legacy = subject_digest_for(tenant, subject)
    return [legacy] if key is None else [subject_digest(key, tenant, subject), legacy]


def open_digest_key(tenant: str, kek_id: str | None, secret: bytes, keks: KeyEncryption | None) -> bytes:
    """A tenant's digest key from its `digest_keys` row: clear when no KEK wrapped it, else unwrapped."""
    if kek_id is None:
        return bytes(secret)
    if keks is None:
        raise KekError(
            f"the subject digest key of tenant {tenant!r} is wrapped by the key-encryption key {kek_id!r} but no "
            "key-encryption key is configured: set LEDGER_KEK or LEDGER_KEK_FILE"
        )
    return keks.unwrap(kek_id, bytes(secret), _digest_key_aad(tenant))


class SubjectDigests:
    """The tenants' digest keys of one key store, read (and created on first use), cached: a key never changes.

    A missing key is created on a connection outside any transaction (the caller's own when it is idle, else a new
    one to `dsn`) and committed at once, so a key this process caches is the key every process reads, even when the
    caller's transaction rolls back.
    """

    def __init__(self, schema: str, keks: KeyEncryption | None, dsn: str | None = None) -> None:
        self.schema, self.keks, self.dsn = schema, keks, dsn
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def key(self, cur: psycopg.Cursor, tenant: str, *, create: bool = True) -> bytes | None:
        """The tenant's digest key (None: it has none and `create` is false)."""
        with self._lock:
            if tenant in self._keys:
                return self._keys[tenant]
        query = sql.SQL("SELECT kek_id, secret FROM {} WHERE tenant = %s").format(_t(self.schema, "digest_keys"))
        row = cur.execute(query, (tenant,)).fetchone()
        if row is None:
            if not create:
                return None
            self._create(cur.connection, tenant)
            row = cur.execute(query, (tenant,)).fetchone()
            assert row is not None, "a committed digest key is visible to the next statement (read committed)"
        key = open_digest_key(tenant, row[0], row[1], self.keks)
        with self._lock:
            self._keys[tenant] = key
        return key

    def digest(self, cur: psycopg.Cursor, tenant: str, subject: str) -> str:
        """The digest that names the subject in new rows (its tenant's key created on first use)."""
        key = self.key(cur, tenant)
        assert key is not None
        return subject_digest(key, tenant, subject)

    def lookup(self, cur: psycopg.Cursor, tenant: str, subject: str) -> list[str]:
        """Every digest rows about the subject may hold (the keyed one, and the unkeyed one of older rows)."""
        return subject_digests(self.key(cur, tenant, create=False), tenant, subject)

    def _create(self, conn: psycopg.Connection, tenant: str) -> None:
        key, kek_id = os.urandom(32), None
        secret = key  # kept clear only where no KEK is configured (encryption off): check_store wraps it later
        if self.keks is not None:
            kek_id = self.keks.active_id
            secret = self.keks.wrap(kek_id, key, _digest_key_aad(tenant))
        insert = sql.SQL("INSERT INTO {} (tenant, kek_id, secret) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING").format(
            _t(self.schema, "digest_keys")
        )
        if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
            conn.execute(insert, (tenant, kek_id, secret))
            return
        if self.dsn is None:
            raise RuntimeError("creating a digest key inside a transaction needs the key store's DSN")
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as side:
            side.execute(insert, (tenant, kek_id, secret))


def check_store(conn: psycopg.Connection, schema: str, keks: KeyEncryption | None) -> dict[str, int]:
    """Fail loudly (KekError) unless `keks` opens everything the store holds; live data keys per KEK id.

    Each configured KEK must open its check value (written on its first use here); every KEK that wraps a live
    data key must be configured. Without any KEK, the store must hold no live data key: such a process could not
    open a sealed record, and finding that out per record would be silent data loss. The tenants' subject digest
    keys follow the same rule; a digest key kept clear (written without a KEK) is wrapped here by the active KEK.
    """
    ensure_key_schema(conn, schema)
    with conn.transaction():
        live = dict(
            conn.execute(
                sql.SQL("SELECT kek_id, count(*) FROM {} WHERE destroyed_at IS NULL GROUP BY kek_id").format(
                    _t(schema, "data_keys")
                )
            ).fetchall()
        )
        digest_keks = dict(
            conn.execute(
                sql.SQL("SELECT kek_id, count(*) FROM {} WHERE kek_id IS NOT NULL GROUP BY kek_id").format(
                    _t(schema, "digest_keys")
                )
            ).fetchall()
        )
        if keks is None:
            if live or digest_keks:
                raise KekError(
                    f"the key store {schema!r} holds {sum(live.values())} data keys and "
                    f"{sum(digest_keks.values())} wrapped subject digest keys but no key-encryption key is "
                    "configured: set LEDGER_KEK or LEDGER_KEK_FILE"
                )
            return {}
        missing = {k: n for k, n in live.items() if k not in keks.ids()}
        missing_digest = {k: n for k, n in digest_keks.items() if k not in keks.ids()}
        if missing or missing_digest:
            said = (
                [
                    "data keys wrapped by key-encryption keys that are not configured: "
                    + ", ".join(f"{k!r} ({n} keys)" for k, n in sorted(missing.items()))
                ]
                if missing
                else []
            )
            if missing_digest:
                said.append(
                    "subject digest keys wrapped by key-encryption keys that are not configured: "
                    + ", ".join(f"{k!r} ({n} tenants)" for k, n in sorted(missing_digest.items()))
                )
            raise KekError(f"the key store {schema!r} holds " + "; and ".join(said))
        checks = dict(
            conn.execute(sql.SQL("SELECT kek_id, check_value FROM {}").format(_t(schema, "kek_checks"))).fetchall()
        )
        for kek_id in sorted(keks.ids()):
            if kek_id in checks:
                try:
                    ok = keks.unwrap(kek_id, bytes(checks[kek_id]), _check_aad(kek_id)) == CHECK_PLAINTEXT
                except KekError:
                    ok = False
                if not ok:
                    raise KekError(
                        f"the key-encryption key {kek_id!r} is not the one this key store {schema!r} was used with "
                        "(its check value does not open): wrong LEDGER_KEK / LEDGER_KEK_FILE"
                    )
            else:
                conn.execute(
                    sql.SQL("INSERT INTO {} (kek_id, check_value) VALUES (%s, %s) ON CONFLICT DO NOTHING").format(
                        _t(schema, "kek_checks")
                    ),
                    (kek_id, keks.wrap(kek_id, CHECK_PLAINTEXT, _check_aad(kek_id))),
                )
        table = _t(schema, "digest_keys")
        clear = conn.execute(
            sql.SQL("SELECT tenant, secret FROM {} WHERE kek_id IS NULL FOR UPDATE").format(table)
        ).fetchall()
        for tenant, secret in clear:  # written while no KEK was configured: from now on, only the KEK opens it
            conn.execute(
                sql.SQL("UPDATE {} SET kek_id = %s, secret = %s WHERE tenant = %s AND kek_id IS NULL").format(table),
                (keks.active_id, keks.wrap(keks.active_id, bytes(secret), _digest_key_aad(tenant)), tenant),
            )
    return live


@dataclass(frozen=True)
class KeyState:
    """A data key as the opener sees it: whose it is, and its bytes (None once destroyed)."""

    key_id: str
    tenant: str
    subject_digest: str
    key: bytes | None = field(repr=False)
    digest_key: bytes | None = field(default=None, repr=False, compare=False)  # its tenant's (SubjectDigests)
    # (topic, partition, offset) of the erasure that destroyed it, as recorded then (None: live, or not recorded)
    destroyed_by: tuple[str, int, int] | None = field(default=None, compare=False)

    @property
    def destroyed(self) -> bool:
        return self.key is None

    def owns(self, tenant: str, subject: str) -> bool:
        """Whether this is a key of (tenant, subject): a record sealed with another subject's key is refused."""
        return tenant == self.tenant and self.subject_digest in subject_digests(self.digest_key, tenant, subject)


def key_states(
    cur: psycopg.Cursor,
    schema: str,
    keks: KeyEncryption | None,
    key_ids: Iterable[str],
    cache: dict[tuple[str, bytes], bytes] | None = None,
    digests: SubjectDigests | None = None,
) -> dict[str, KeyState]:
    """The data keys of `key_ids` that the store knows, unwrapped (in the caller's transaction and snapshot).

    An id the store does not know is absent. A live key whose KEK is not configured raises KekError: the caller
    must stop, not dead-letter (check_store at start makes this the exception). `digests`: the store's digest keys
    (a process-wide cache; read here when not given) that tell whose a key is (`KeyState.owns`).
    """
    digests = digests or SubjectDigests(schema, keks)
    ids = sorted(set(key_ids))
    if not ids:
        return {}
    cur.execute(
        sql.SQL(
            'SELECT k.key_id, k.tenant, k.subject_digest, k.kek_id, k.wrapped, e.topic, e."partition", e."offset" '
            "FROM {} k LEFT JOIN {} e ON k.wrapped IS NULL AND e.tenant = k.tenant AND e.erasure_id = k.erasure_id "
            "WHERE k.key_id = ANY(%s)"
        ).format(_t(schema, "data_keys"), _t(schema, "erasures")),
        (ids,),
    )
    out: dict[str, KeyState] = {}
    rows = cur.fetchall()
    owners = {t: digests.key(cur, t, create=False) for t in {row[1] for row in rows}}
    for key_id, tenant, digest, kek_id, wrapped, e_topic, e_partition, e_offset in rows:
        if wrapped is None:
            by = (e_topic, e_partition, e_offset) if e_topic is not None else None
            out[key_id] = KeyState(key_id, tenant, digest, None, owners[tenant], by)
            continue
        if keks is None:
            raise KekError(f"a sealed record needs data key {key_id!r} but no key-encryption key is configured")
        wrapped = bytes(wrapped)
        key = cache.get((key_id, wrapped)) if cache is not None else None
        if key is None:  # unwrapping is the KEK's work (a KMS round trip elsewhere): once per wrapped key
            key = keks.unwrap(kek_id, wrapped, _key_aad(key_id, tenant, digest))
            if cache is not None:
                if len(cache) >= 100_000:
                    cache.clear()
                cache[(key_id, wrapped)] = key
        out[key_id] = KeyState(key_id, tenant, digest, key, owners[tenant])
    return out


def destroy_subject_keys(
    cur: psycopg.Cursor, digests: SubjectDigests, tenant: str, subject: str, erasure_id: str
) -> list[tuple[str, str]]:
    """Destroy the keys that sealed the subject's past (wrapped bytes overwritten by NULL); [(key_id, fingerprint)].

    Which keys: every retired one (a producer retires the live key before it publishes an erasure, so events
    published after the erasure get a new key that this erasure leaves alone), and the live key too unless this
    erasure retired one (an erasure published by a path that did not retire: a raw Kafka producer).
    """
    table = _t(digests.schema, "data_keys")
    cur.execute(
        sql.SQL(
            "UPDATE {t} SET wrapped = NULL, kek_id = NULL, destroyed_at = now(), erasure_id = %(e)s "
            "WHERE tenant = %(t)s AND subject_digest = ANY(%(d)s) AND destroyed_at IS NULL AND (retired_at IS NOT NULL "
            "OR NOT EXISTS (SELECT 1 FROM {t} r WHERE r.tenant = %(t)s AND r.subject_digest = ANY(%(d)s) "
            "AND r.retired_by = %(e)s)) RETURNING key_id, fingerprint"
        ).format(t=table),
        {"e": erasure_id, "t": tenant, "d": digests.lookup(cur, tenant, subject)},
    )
    return sorted(cur.fetchall())


def retire_subject_key(
    conn: psycopg.Connection, digests: SubjectDigests, tenant: str, subject: str, erasure_id: str
) -> int:
    """Stop handing out the subject's live key: `erasure_id` is about to be published (producers call this first).

    Other processes may hold the key in their caches (`producers.keys.provider.CachedKeys`): the notification on
    ERASURE_CHANNEL, delivered when this commits, makes those that listen (the API's and the MCP server's) drop it
    at once, not when their cache's time runs out."""
    cur = conn.cursor()
    cur.execute(
        sql.SQL(
            "UPDATE {} SET retired_at = now(), retired_by = %s WHERE tenant = %s AND subject_digest = ANY(%s) "
            "AND destroyed_at IS NULL AND retired_at IS NULL"
        ).format(_t(digests.schema, "data_keys")),
        (erasure_id, tenant, digests.lookup(cur, tenant, subject)),
    )
    retired = cur.rowcount
    cur.execute(
        "SELECT pg_notify(%s, json_build_object('schema', %s::text, 'tenant', %s::text)::text)",
        (ERASURE_CHANNEL, digests.schema, tenant),
    )
    return retired


@dataclass(frozen=True)
class ErasureRecord:
    """What one erasure did (the `erasures` row): counts, keys and offsets; the subject is stored as its digest."""

    tenant: str
    erasure_id: str
    subject: str = field(repr=False)
    requested_at: Any
    topic: str
    partition: int
    offset: int
    first_offset: int | None
    records: int
    sealed_records: int
    clear_records: int
    key_ids: list[str]
    key_fingerprints: list[str]
    purged: dict[str, Any]


def erasure_recorded(cur: psycopg.Cursor, schema: str, tenant: str, erasure_id: str) -> bool:
    """Whether this erasure was applied before (by the live worker, or a rebuild): its keys are gone already."""
    cur.execute(
        sql.SQL("SELECT 1 FROM {} WHERE tenant = %s AND erasure_id = %s").format(_t(schema, "erasures")),
        (tenant, erasure_id),
    )
    return cur.fetchone() is not None


def record_erasure(cur: psycopg.Cursor, digests: SubjectDigests, r: ErasureRecord) -> None:
    """Write the erasure record, naming its subject by the tenant's keyed digest (the key created on first use)."""
    digest = digests.digest(cur, r.tenant, r.subject)
    cur.execute(
        sql.SQL(
            'INSERT INTO {} (tenant, erasure_id, subject_digest, requested_at, topic, "partition", "offset", '
            "first_offset, records, sealed_records, clear_records, key_ids, key_fingerprints, purged) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
        ).format(_t(digests.schema, "erasures")),
        (
            r.tenant,
            r.erasure_id,
            digest,
            r.requested_at,
            r.topic,
            r.partition,
            r.offset,
            r.first_offset,
            r.records,
            r.sealed_records,
            r.clear_records,
            r.key_ids,
            r.key_fingerprints,
            Jsonb(r.purged),
        ),
    )


def search_purged(
    cur: psycopg.Cursor, schema: str, tenant: str, subject: str, documents: int, keks: KeyEncryption | None = None
) -> None:
    """The indexer deleted `documents` search documents of an erased subject: complete its erasure records.

    Nothing to complete where no worker created the key store yet (an indexer started alone); a tenant without a
    digest key can only have records of the older, unkeyed digest. An indexer without the KEK that wraps the
    tenant's digest key cannot name the subject: it says so and leaves the record incomplete (the documents are
    deleted all the same).
    """
    cur.execute("SELECT to_regclass(%s)", (_t(schema, "digest_keys").as_string(cur.connection),))
    row = cur.fetchone()
    if row is None or row[0] is None:
        return
    try:
        key = SubjectDigests(schema, keks).key(cur, tenant, create=False)
    except KekError as exc:
        log.warning("erasure record of tenant %r not completed: %s", tenant, exc)
        return
    cur.execute(
        sql.SQL(
            "UPDATE {} SET search_documents = coalesce(search_documents, 0) + %s, search_purged_at = now() "
            "WHERE tenant = %s AND subject_digest = ANY(%s) AND search_purged_at IS NULL"
        ).format(_t(schema, "erasures")),
        (documents, tenant, subject_digests(key, tenant, subject)),
    )


def rotate(
    conn: psycopg.Connection,
    schema: str,
    keks: KeyEncryption,
    *,
    batch: int = 500,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Rewrap every live data key not under the active KEK with it (the log is not touched); how many were.

    The tenants' digest keys are rewrapped first (a few rows: one per tenant), and not counted.
    """
    check_store(conn, schema, keks)
    with conn.transaction():
        table = _t(schema, "digest_keys")
        rows = conn.execute(
            sql.SQL("SELECT tenant, kek_id, secret FROM {} WHERE kek_id <> %s FOR UPDATE").format(table),
            (keks.active_id,),
        ).fetchall()
        for tenant, kek_id, secret in rows:
            aad = _digest_key_aad(tenant)
            conn.execute(
                sql.SQL("UPDATE {} SET kek_id = %s, secret = %s WHERE tenant = %s").format(table),
                (keks.active_id, keks.wrap(keks.active_id, keks.unwrap(kek_id, bytes(secret), aad), aad), tenant),
            )
    done = 0
    while True:
        with conn.transaction():
            rows = conn.execute(
                sql.SQL(
                    "SELECT key_id, tenant, subject_digest, kek_id, wrapped FROM {} WHERE destroyed_at IS NULL "
                    "AND kek_id <> %s ORDER BY key_id LIMIT %s FOR UPDATE SKIP LOCKED"
                ).format(_t(schema, "data_keys")),
                (keks.active_id, batch),
            ).fetchall()
            if not rows:
                return done
            for key_id, tenant, digest, kek_id, wrapped in rows:
                aad = _key_aad(key_id, tenant, digest)
                rewrapped = keks.wrap(keks.active_id, keks.unwrap(kek_id, bytes(wrapped), aad), aad)
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET kek_id = %s, wrapped = %s WHERE key_id = %s AND destroyed_at IS NULL"
                    ).format(_t(schema, "data_keys")),
                    (keks.active_id, rewrapped, key_id),
                )
            done += len(rows)
            if progress:
                progress(len(rows))


class KeyStore:
    """The producer side of the store: each subject's live data key, created on first use (one connection, locked)."""

    def __init__(self, dsn: str, schema: str, keks: KeyEncryption, *, connect_timeout_s: int = 3) -> None:
        self.dsn, self.schema, self.keks = dsn, schema, keks
        self.digests = SubjectDigests(schema, keks, dsn)
        self._timeout = connect_timeout_s
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(2, self._timeout))
            check_store(self._conn, self.schema, self.keks)
        return self._conn

    def check(self) -> dict[str, int]:
        """Connect and check the KEKs against the store now (KekError if they do not fit)."""
        with self._lock:
            return check_store(self._connection(), self.schema, self.keks)

    def sealing_keys(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], DataKey]:
        """(tenant, subject) -> its live data key, creating the missing ones (a concurrent creator's key wins).

        A subject's live key is found under any digest the store may hold for it (`SubjectDigests.lookup`, older
        rows included); a new key is stored under the keyed digest.
        """
        pairs = list(dict.fromkeys(pairs))
        if not pairs:
            return {}

        def live_keys(conn: psycopg.Connection) -> dict[tuple[str, str], DataKey]:
            cur = conn.cursor()
            wanted = {(t, s): self.digests.lookup(cur, t, s) for t, s in pairs}
            found = self._live(conn, wanted)
            missing = [p for p in pairs if p not in found]
            if missing:  # created once: a second try finds what the first created (ON CONFLICT DO NOTHING)
                self._create(conn, [(t, self.digests.digest(cur, t, s)) for t, s in missing])
                found.update(self._live(conn, {(t, s): self.digests.lookup(cur, t, s) for t, s in missing}))
            return found

        return self._on_connection(live_keys)

    def _on_connection(self, work: Callable[[psycopg.Connection], _T]) -> _T:
        """work(conn) on the store's one connection, under its lock. A connection that died since its last use
        (the server restarted) is replaced and the work tried once more, so the first call after a restart does
        not fail; a new connection's failure is raised (the server is away)."""
        with self._lock:
            for _ in range(2):
                reused = self._conn is not None and not self._conn.closed
                conn = self._connection()
                try:
                    return work(conn)
                except psycopg.OperationalError:
                    conn.close()
                    if not reused:
                        raise
            raise AssertionError("unreachable: a second try is on a new connection")

    def _live(
        self, conn: psycopg.Connection, wanted: dict[tuple[str, str], list[str]]
    ) -> dict[tuple[str, str], DataKey]:
        by_digest = {(t, d): (t, s) for (t, s), digests in wanted.items() for d in digests}
        rows = conn.execute(
            sql.SQL(
                "SELECT key_id, tenant, subject_digest, kek_id, wrapped FROM {} WHERE destroyed_at IS NULL "
                "AND retired_at IS NULL AND (tenant, subject_digest) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
            ).format(_t(self.schema, "data_keys")),
            ([t for t, _ in by_digest], [d for _, d in by_digest]),
        ).fetchall()
        out = {}
        for key_id, tenant, digest, kek_id, wrapped in rows:
            key = self.keks.unwrap(kek_id, bytes(wrapped), _key_aad(key_id, tenant, digest))
            out[by_digest[(tenant, digest)]] = DataKey(key_id, key)
        return out

    def _create(self, conn: psycopg.Connection, rows: Sequence[tuple[str, str]]) -> None:
        ids, tenants, digests, keks, wrapped, prints = [], [], [], [], [], []
        for tenant, digest in rows:
            key_id, key = uuid.uuid4().hex, os.urandom(32)
            ids.append(key_id)
            tenants.append(tenant)
            digests.append(digest)
            keks.append(self.keks.active_id)
            wrapped.append(self.keks.wrap(self.keks.active_id, key, _key_aad(key_id, tenant, digest)))
            prints.append(fingerprint_of(key))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (key_id, tenant, subject_digest, kek_id, wrapped, fingerprint) "
                "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bytea[], %s::text[]) "
                "ON CONFLICT (tenant, subject_digest) WHERE destroyed_at IS NULL AND retired_at IS NULL DO NOTHING"
            ).format(_t(self.schema, "data_keys")),
            (ids, tenants, digests, keks, wrapped, prints),
        )

    def retire(self, tenant: str, subject: str, erasure_id: str) -> int:
        """The subject's erasure `erasure_id` is about to be published: its next event gets a new key."""
        return self._on_connection(lambda conn: retire_subject_key(conn, self.digests, tenant, subject, erasure_id))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


@dataclass(frozen=True)
class KeyContext:
    """What a reader of the ledger needs to open sealed records and to shred on erasure (recorder, rebuild)."""

    schema: str  # the key store's schema (Settings.keys_schema)
    keks: KeyEncryption | None  # None: no KEK configured (then the store must hold no live key: check_store)
    required: bool = False  # encryption=required: a clear record with personal fields is refused (`not_encrypted`)
    dsn: str | None = None  # where a tenant's first digest key is created (outside the recorder's transaction)
    digests: SubjectDigests = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digests", SubjectDigests(self.schema, self.keks, self.dsn))


def settings_keks(settings: Settings) -> KeyEncryption | None:
    """The KEKs `settings` configure (LEDGER_KEK or LEDGER_KEK_FILE), None if none; KekError if unusable."""
    return load_keks(settings.kek.get_secret_value() if settings.kek else None, settings.kek_file)


def unsealed_warning(settings: Settings) -> str | None:
    """What a process must say at start when personal data reaches the ledger in clear text, else None.

    Every deployment holds personal data (memories are about subjects); a development machine holds the demo's.
    So: encryption off outside development. An erasure then cannot reach the Kafka log (only retention can).
    """
    if settings.encryption != "off" or settings.development:
        return None
    return (
        "LEDGER_ENCRYPTION is off: producers publish personal fields in clear text to the Kafka topic "
        f"{settings.topic!r}, where an erasure cannot reach them; set LEDGER_ENCRYPTION=on with LEDGER_KEK or "
        "LEDGER_KEK_FILE (docs/encryption.md)"
    )


def key_context(settings: Settings, conn: psycopg.Connection) -> KeyContext:
    """The KeyContext of `settings`, checked against the store now: a missing or wrong KEK raises KekError here.

    Outside development, encryption off is logged as a WARNING (`unsealed_warning`): every reader of the ledger
    starts here, the worker first.
    """
    keks = settings_keks(settings)
    if keks is None and settings.encryption != "off":
        raise KekError(
            f"LEDGER_ENCRYPTION is {settings.encryption} but no key-encryption key is configured: "
            "set LEDGER_KEK or LEDGER_KEK_FILE"
        )
    warning = unsealed_warning(settings)
    if warning:
        log.warning(warning)
    check_store(conn, settings.keys_schema, keks)
    return KeyContext(settings.keys_schema, keks, required=settings.encryption == "required", dsn=settings.pg_dsn)

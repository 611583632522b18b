"""The ledger chain: every record the projection takes, hashed into one chain per partition, and signed checkpoints.

Links hash each record's key and value bytes as they stand in the log (sealed when encryption is on), so no
personal data enters the chain and an erasure, which leaves the log as it is, never breaks it. Heads and signed
checkpoints are written in the batch's transaction with the positions, so a head covers exactly what was taken,
and checkpoints fall at fixed link counts so a replay (`ledger rebuild`) signs the same ones. Each checkpoint
stores its public key, so `ledger verify` needs no secret. docs/INTERNALS.md, "The ledger chain".
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from producers.keys.signing import ChainSigner, load_signer, signature_valid

if TYPE_CHECKING:
    from producers.settings import Settings

__all__ = [
    "GENESIS",
    "Checkpoint",
    "Checkpoints",
    "Head",
    "advance_chain",
    "chain",
    "checkpoint_message",
    "checkpoint_valid",
    "copy_checkpoints",
    "link",
    "read_checkpoints",
    "read_heads",
    "read_starts",
    "sign_idle_heads",
]

log = logging.getLogger(__name__)

GENESIS = hashlib.sha256(b"memory-ledger chain v1").digest()  # what a partition's first link hashes as "previous"
_FRAME = struct.Struct(">iqqq")  # partition, offset, key length, value length (-1: null, which Kafka tells from b"")
_CHECKPOINT = b"memory-ledger checkpoint v1\n"
_SIGNED = struct.Struct(">iqqq")  # partition, first_offset, offset, count


def link(prev: bytes, partition: int, offset: int, key: bytes | None, value: bytes | None) -> bytes:
    """The link of one record: sha256(prev || partition || offset || len(key) || len(value) || key || value).

    Fixed-width fields and lengths first, so no two records frame to the same bytes; a null key or value is
    length -1, apart from an empty one.
    """
    h = hashlib.sha256(prev)
    h.update(_FRAME.pack(partition, offset, -1 if key is None else len(key), -1 if value is None else len(value)))
    if key:
        h.update(key)
    if value:
        h.update(value)
    return h.digest()


def chain(prev: bytes, partition: int, records: Iterable[tuple[int, bytes | None, bytes | None]]) -> bytes:
    """The link after (offset, key, value) records of one partition in log order, from `prev`."""
    for offset, key, value in records:
        prev = link(prev, partition, offset, key, value)
    return prev


@dataclass(frozen=True, slots=True)
class Head:
    """A partition's chain as far as it goes: the last link, its record's offset, the records in it, where it began."""

    partition: int
    head: bytes
    offset: int
    count: int
    first_offset: int

    def as_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "head": self.head.hex(),
            "offset": self.offset,
            "count": self.count,
            "first_offset": self.first_offset,
        }


def checkpoint_message(topic: str, head: Head) -> bytes:
    """The bytes a checkpoint signs: a fixed tag, the topic, the partition, first_offset, offset, count, the head."""
    return (
        _CHECKPOINT
        + topic.encode()
        + b"\n"
        + _SIGNED.pack(head.partition, head.first_offset, head.offset, head.count)
        + head.head
    )


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed head as stored."""

    head: Head
    key_id: str
    public_key: bytes
    signature: bytes


def checkpoint_valid(topic: str, cp: Checkpoint) -> bool:
    """Whether the stored signature is the stored public key's over the stored head (no secret needed)."""
    return signature_valid(cp.public_key, cp.signature, checkpoint_message(topic, cp.head))


@dataclass(frozen=True)
class Checkpoints:
    """When and with what key the projection signs its heads."""

    signer: ChainSigner
    every_records: int
    every_s: float

    @classmethod
    def for_settings(cls, settings: Settings) -> Checkpoints | None:
        """None when no signing key is configured (heads only); SigningKeyError when the configured one is unusable."""
        signer = load_signer(settings.chain_key_file)
        if signer is None:
            return None
        return cls(signer, settings.chain_checkpoint_records, settings.chain_checkpoint_s)

    def boundary(self, count: int) -> bool:
        """Whether the link that makes the chain `count` records long is signed: every `every_records`-th, wherever
        batches begin and end, so a replay signs the same links (Ed25519 signatures are deterministic)."""
        return count % self.every_records == 0

    def due(self, count: int, last_count: int | None, age_s: float | None) -> bool:
        """Whether a head of `count` records is signed as it stands, after a checkpoint of `last_count` records
        signed `age_s` seconds ago: a chain's first head at once, then a head that grew once `every_s` passed."""
        if last_count is None:
            return True
        return count > last_count and age_s is not None and age_s >= self.every_s


# the heads of some partitions and, per head, the last checkpoint of its chain (count, age in seconds by the database)
_HEADS_AND_LAST = """
SELECT h."partition", h.head, h."offset", h.count, h.first_offset, c.count, extract(epoch FROM now() - c.signed_at)
FROM chain_heads h LEFT JOIN LATERAL (
    SELECT k.count, k.signed_at FROM chain_checkpoints k
    WHERE k.consumer = h.consumer AND k.topic = h.topic AND k."partition" = h."partition"
      AND k.first_offset = h.first_offset
    ORDER BY k.count DESC LIMIT 1) c ON true
WHERE h.consumer = %s AND h.topic = %s"""


def advance_chain(
    cur: psycopg.Cursor,
    consumer: str,
    topic: str,
    records: Sequence[Any],
    checkpoints: Checkpoints | None = None,
) -> dict[int, Head]:
    """Inside a batch transaction that holds the position rows of the records' partitions: extend each partition's
    chain by `records` (above the stored positions, log order per partition: anything with partition, offset, key,
    raw), store the heads and sign those due; returns the new heads."""
    parts = sorted({r.partition for r in records})
    if checkpoints is None:
        cur.execute(
            'SELECT "partition", head, "offset", count, first_offset, NULL, NULL FROM chain_heads '
            'WHERE consumer = %s AND topic = %s AND "partition" = ANY(%s)',
            (consumer, topic, parts),
        )
    else:
        cur.execute(_HEADS_AND_LAST + ' AND h."partition" = ANY(%s)', (consumer, topic, parts))
    state: dict[int, list[Any]] = {}
    last: dict[int, tuple[int | None, float | None]] = {}
    for p, head, offset, count, first, last_count, age in cur.fetchall():
        state[p] = [bytes(head), offset, count, first]
        last[p] = (last_count, None if age is None else float(age))
    signed: list[Head] = []
    links: list[bytes] = []
    for r in records:
        s = state.get(r.partition)
        if s is None:
            s = state[r.partition] = [GENESIS, None, 0, r.offset]
        s[0] = link(s[0], r.partition, r.offset, r.key, r.raw)
        links.append(s[0])
        s[1] = r.offset
        s[2] += 1
        if checkpoints is not None and checkpoints.boundary(s[2]):
            signed.append(Head(r.partition, *s))
            last[r.partition] = (s[2], 0.0)
    heads = {p: Head(p, *state[p]) for p in parts}
    cur.execute(
        'INSERT INTO chain_heads (consumer, topic, "partition", head, "offset", count, first_offset) '
        "SELECT %s, %s, * FROM unnest(%b::int[], %b::bytea[], %b::bigint[], %b::bigint[], %b::bigint[]) "
        'ON CONFLICT (consumer, topic, "partition") DO UPDATE '
        'SET head = excluded.head, "offset" = excluded."offset", count = excluded.count',
        (
            consumer,
            topic,
            parts,
            [heads[p].head for p in parts],
            [heads[p].offset for p in parts],
            [heads[p].count for p in parts],
            [heads[p].first_offset for p in parts],
        ),
    )
    # each record's own link, for the receipts that cite it (a redelivered record links the same: nothing changes)
    cur.execute(
        'INSERT INTO chain_links (consumer, topic, "partition", "offset", link) '
        "SELECT %s, %s, * FROM unnest(%b::int[], %b::bigint[], %b::bytea[]) ON CONFLICT DO NOTHING",
        (consumer, topic, [r.partition for r in records], [r.offset for r in records], links),
    )
    if checkpoints is not None:
        signed += [h for h in heads.values() if checkpoints.due(h.count, *last.get(h.partition, (None, None)))]
        _store_checkpoints(cur, consumer, topic, signed, checkpoints.signer)
    return heads


def _store_checkpoints(cur: psycopg.Cursor, consumer: str, topic: str, heads: list[Head], signer: ChainSigner) -> int:
    if not heads:
        return 0
    heads = sorted(heads, key=lambda h: (h.partition, h.count))  # one order for every writer
    cur.execute(
        "INSERT INTO chain_checkpoints "
        '(consumer, topic, "partition", count, "offset", first_offset, head, key_id, public_key, signature) '
        "SELECT %s, %s, * FROM unnest(%b::int[], %b::bigint[], %b::bigint[], %b::bigint[], %b::bytea[], "
        "%b::text[], %b::bytea[], %b::bytea[]) ON CONFLICT DO NOTHING",
        (
            consumer,
            topic,
            [h.partition for h in heads],
            [h.count for h in heads],
            [h.offset for h in heads],
            [h.first_offset for h in heads],
            [h.head for h in heads],
            [signer.key_id] * len(heads),
            [signer.public] * len(heads),
            [signer.sign(checkpoint_message(topic, h)) for h in heads],
        ),
    )
    return cur.rowcount


def sign_idle_heads(conn: psycopg.Connection, consumer: str, topic: str, checkpoints: Checkpoints) -> int:
    """Sign the heads whose last checkpoint is older than `every_s` and that grew since (a partition no batch
    reaches any more keeps a signed head); in a transaction of its own, beside the projection's. How many."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(_HEADS_AND_LAST, (consumer, topic))
        due = [
            Head(p, bytes(head), offset, count, first)
            for p, head, offset, count, first, last_count, age in cur.fetchall()
            if checkpoints.due(count, last_count, None if age is None else float(age))
        ]
        return _store_checkpoints(cur, consumer, topic, due, checkpoints.signer)


def read_heads(conn: psycopg.Connection | psycopg.Cursor, consumer: str, topic: str) -> dict[int, Head]:
    """partition -> the stored head of (consumer, topic)."""
    rows = conn.execute(
        'SELECT "partition", head, "offset", count, first_offset FROM chain_heads WHERE consumer = %s AND topic = %s',
        (consumer, topic),
    ).fetchall()
    return {p: Head(p, bytes(h), o, c, f) for p, h, o, c, f in rows}


def read_starts(conn: psycopg.Connection | psycopg.Cursor, consumer: str, topic: str) -> dict[int, int]:
    """partition -> where its chain began in a schema that predates the chain (`chain_starts`); absent: 0."""
    rows = conn.execute(
        'SELECT "partition", first_offset FROM chain_starts WHERE consumer = %s AND topic = %s', (consumer, topic)
    ).fetchall()
    return dict(rows)


def read_checkpoints(conn: psycopg.Connection | psycopg.Cursor, consumer: str, topic: str) -> list[Checkpoint]:
    """Every stored checkpoint of (consumer, topic), by partition, chain and count."""
    rows = conn.execute(
        'SELECT "partition", head, "offset", count, first_offset, key_id, public_key, signature '
        'FROM chain_checkpoints WHERE consumer = %s AND topic = %s ORDER BY "partition", first_offset, count',
        (consumer, topic),
    ).fetchall()
    return [
        Checkpoint(Head(p, bytes(h), o, c, f), kid, bytes(pub), bytes(sig)) for p, h, o, c, f, kid, pub, sig in rows
    ]


def copy_checkpoints(conn: psycopg.Connection, source: str, target: str) -> int:
    """Carry `source`'s checkpoints into `target` (`ledger rebuild`, at the switch): the live schema's attestations
    are kept as they were signed, over any the replay made at the same count; how many."""
    exists = conn.execute("SELECT to_regclass(%s)", (sql.Identifier(source, "chain_checkpoints").as_string(conn),))
    row = exists.fetchone()
    if row is None or row[0] is None:
        return 0
    cols = '"partition", count, "offset", first_offset, head, key_id, public_key, signature, signed_at'
    cur = conn.execute(
        sql.SQL(
            "INSERT INTO {t} (consumer, topic, " + cols + ") SELECT consumer, topic, " + cols + " FROM {s} "
            'ON CONFLICT (consumer, topic, "partition", first_offset, count) DO UPDATE '
            'SET "offset" = excluded."offset", head = excluded.head, key_id = excluded.key_id, '
            "public_key = excluded.public_key, signature = excluded.signature, signed_at = excluded.signed_at"
        ).format(t=sql.Identifier(target, "chain_checkpoints"), s=sql.Identifier(source, "chain_checkpoints"))
    )
    return cur.rowcount

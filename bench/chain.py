"""`python -m bench.chain`: what the ledger chain costs per event (projections.postgres.chain).

1. The link function alone: `chain.link` over `--records` records of `--value-bytes` bytes (a sealed record's
   size), best of 5 passes (timeit's rule), µs per record.
2. One checkpoint signature (Ed25519 over the checkpoint message), best of 5 over 1,000, µs each.
3. In PostgreSQL, the worker's batch transaction without the projection's own rows: `lock_positions` +
   `advance_positions` (the baseline) against the same + `advance_chain` (heads read and written, and with a
   signing key every `--every`-th link signed), `--batches` batches of `--batch-size` records over 6 partitions, the
   three ways interleaved batch by batch; the process's CPU time and the wall time per event (median over batches),
   on a private schema dropped at the end.

The machine is shared: run it more than once and compare medians.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from dataclasses import dataclass

import psycopg
import typer

from bench.latency import per_item_us
from producers.keys.signing import ChainSigner, new_signing_key
from producers.settings import get_settings
from projections.postgres.chain import GENESIS, Checkpoints, Head, advance_chain, checkpoint_message, link
from projections.postgres.positioned import connect
from projections.postgres.positions import advance_positions, lock_positions
from projections.postgres.schema import create_schema, drop_schema

__all__ = ["main"]


@dataclass(frozen=True)
class _Record:
    partition: int
    offset: int
    key: bytes
    raw: bytes


def main(
    records: int = typer.Option(5000, help="records for the link micro-benchmark"),
    value_bytes: int = typer.Option(700, help="bytes of each record's value (a sealed record is about 700)"),
    batches: int = typer.Option(60, help="batches per way in PostgreSQL"),
    batch_size: int = typer.Option(500, help="records per batch (the worker's default)"),
    every: int = typer.Option(1000, help="sign every N-th link (LEDGER_CHAIN_CHECKPOINT_RECORDS)"),
) -> None:
    values = [os.urandom(value_bytes) for _ in range(records)]
    key = b"acme|user:42"
    prev = GENESIS
    link_us = per_item_us(lambda v: link(prev, 3, 123456, key, v), values)
    signer = ChainSigner.of_pem(new_signing_key())
    head = Head(3, GENESIS, 999, 1000, 0)
    sign_us = per_item_us(lambda _: signer.sign(checkpoint_message("memory.events", head)), range(1000))
    print(f"link: {link_us:.2f} µs per record of {value_bytes} B; checkpoint signature: {sign_us:.1f} µs each")

    settings = get_settings()
    schema = f"bench_chain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, schema)
    policy = Checkpoints(signer, every, 3600.0)
    ways = {"positions only": None, "+ chain": "chain", "+ chain, signed": "signed"}
    cpu: dict[str, list[float]] = {w: [] for w in ways}
    wall: dict[str, list[float]] = {w: [] for w in ways}
    try:
        with connect(settings.pg_dsn, schema) as conn:
            offsets = {w: dict.fromkeys(range(6), 0) for w in ways}
            for b in range(batches):
                order = list(ways) if b % 2 == 0 else list(reversed(ways))
                for way in order:
                    consumer, kind = f"bench-{way}", ways[way]
                    batch = []
                    for i in range(batch_size):
                        p = i % 6
                        batch.append(_Record(p, offsets[way][p], key, values[(b * batch_size + i) % len(values)]))
                        offsets[way][p] += 1
                    c0, t0 = time.process_time(), time.perf_counter()
                    with conn.transaction(), conn.cursor() as cur:
                        stored = lock_positions(cur, consumer, "memory.events", list(range(6)))
                        if kind is not None:
                            advance_chain(cur, consumer, "memory.events", batch, policy if kind == "signed" else None)
                        advance_positions(
                            cur, consumer, "memory.events", {p: max(stored[p], offsets[way][p]) for p in range(6)}
                        )
                    cpu[way].append((time.process_time() - c0) / batch_size * 1e6)
                    wall[way].append((time.perf_counter() - t0) / batch_size * 1e6)
    finally:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
            drop_schema(admin, schema)
    base_cpu, base_wall = statistics.median(cpu["positions only"]), statistics.median(wall["positions only"])
    print(f"batch transaction, {batches} batches of {batch_size} over 6 partitions, medians per event:")
    for way in ways:
        c, w = statistics.median(cpu[way]), statistics.median(wall[way])
        print(f"  {way:18s} CPU {c:6.2f} µs (+{c - base_cpu:5.2f})   wall {w:6.2f} µs (+{w - base_wall:5.2f})")


if __name__ == "__main__":
    typer.run(main)

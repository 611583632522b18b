"""`python -m bench receipts`: what receipts cost recall (and a subject's facts, `--modes facts`), measured in one run.

bench.access's comparison: two API processes on the same private data, one answering receipts (`LEDGER_RECEIPTS`
true, signed with the local chain key), one not; the same real questions to both, interleaved request by request,
alternating which is asked first. Reported per mode: client-side p50/p90/p99 of each, the p50 difference in ms and
percent, and, in process, what signing one receipt costs. Target: receipts add at most 5% to recall's p50.

Writes bench/results/receipts-<UTC>.json (and prints it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from bench.access import EVENTS, MODES, QUERIES, ROUNDS, compare, write
from infra.service import local_chain_key
from producers.keys.signing import load_signer
from producers.settings import Settings, get_settings

__all__ = ["receipts_command", "sign_cost"]


def sign_cost(key_file: Path, n: int = 2_000, cited: int = 5) -> dict[str, float]:
    """Microseconds to serialize and sign a receipt citing `cited` events (api.receipts' canonical JSON)."""
    from api.receipts import canonical

    signer = load_signer(key_file)
    assert signer is not None
    receipt: dict[str, Any] = {
        "receipt": 1,
        "answer": "recall",
        "cited": [{"version_id": "v" * 32, "link": "l" * 64, "digest": "d" * 64, "subject": "s" * 32}] * cited,
    }
    t0 = time.perf_counter()
    for _ in range(n):
        signer.sign(b"memory-ledger receipt v1\n" + canonical(receipt))
    return {"receipts": n, "cited": cited, "us_per_receipt": round((time.perf_counter() - t0) / n * 1e6, 2)}


def receipts_command(
    events: int = EVENTS,
    queries: int = QUERIES,
    rounds: int = ROUNDS,
    modes: str = MODES,
    out: Path | None = typer.Option(None, help="JSON output (default: bench/results/receipts-<UTC>.json)"),
) -> None:
    """Recall's latency with and without receipts, interleaved on two API processes over the same data."""
    key = local_chain_key(get_settings())

    def costs(settings: Settings, urls: dict[str, str]) -> dict[str, Any]:
        return {"sign": sign_cost(key), "target": "receipts add <= 5% to recall's p50"}

    variants = {
        "receipts": {"receipts": True, "chain_key_file": key},
        "no_receipts": {"receipts": False, "chain_key_file": key},
    }
    write(compare("receipts", variants, events, queries, rounds, modes, costs), "receipts", out)

"""The PostgreSQL projection: schema, the batch recorder (rows + position in one transaction), reads.

- `schema` (`schema.sql`), `connection`: the tables, and connections bound to their schema.
- `positioned`: a topic's records applied exactly once with their positions, the base of the two writers:
  `recorder` (ledger records -> rows) and `access_projector` (access records; `accesses`: their shared rules).
- `idempotency`, `positions`, `counts`, `erasures`: event ids, consumer positions, `/v1/stats` counters, and the
  erasure records.
- `chain`: the ledger chain and its signed checkpoints.
- `queries`, `stats`, `subject_search`, `dead_letters`, `receipts`: the API's reads.

jsonb goes through orjson (faster than the stdlib json), set once for every psycopg connection of the process.
"""

from __future__ import annotations

from typing import Any

import orjson
from psycopg.types.json import set_json_dumps, set_json_loads

from producers.contract import INT_MAX, INT_MIN, has_long_digit_run


def _as_stored(value: Any) -> Any:
    """`value` with each integer outside signed 64 bits as the float it was: jsonb keeps a number as a decimal, so a
    float past 2**63 (1e19) comes back as its integer digits, which orjson reads as an integer below 2**64; the
    contract admits no such integer, so only a float can have been stored so."""
    if type(value) is int:
        return value if INT_MIN <= value <= INT_MAX else float(value)
    if type(value) is dict:
        return {k: _as_stored(v) for k, v in value.items()}
    if type(value) is list:
        return [_as_stored(v) for v in value]
    return value


def _load_jsonb(data: bytes | bytearray | memoryview) -> Any:
    value = orjson.loads(data)
    if len(data) < 19 or type(value) is str:  # too short for 19 digits, or text: no integer to look at
        return value
    raw = data if isinstance(data, bytes) else bytes(data)
    return _as_stored(value) if has_long_digit_run(raw) else value  # 19 digits or more: maybe such an integer


set_json_dumps(orjson.dumps)
set_json_loads(_load_jsonb)

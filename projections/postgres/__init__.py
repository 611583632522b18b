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

import orjson
from psycopg.types.json import set_json_dumps, set_json_loads

set_json_dumps(orjson.dumps)
set_json_loads(orjson.loads)

"""The PostgreSQL projection: schema, the batch recorder (rows + position in one transaction), reads.

jsonb goes through orjson (faster than the stdlib json), set once for every psycopg connection of the process.
"""

from __future__ import annotations

import orjson
from psycopg.types.json import set_json_dumps, set_json_loads

set_json_dumps(orjson.dumps)
set_json_loads(orjson.loads)

"""The API's reads take PostgreSQL's generic plans (projections.postgres.connection.GENERIC_PLANS).

Recall's verification was planned anew on every call (its generic plan's estimate for `= ANY(array)` of unknown
length looked dearer than the custom ones), and planning took longer than running it. On the real server: every
connection of the API's pool has `plan_cache_mode = force_generic_plan`, and the verification statement, once
prepared, runs its one generic plan from its first execution (PostgreSQL's default plans the first five anew).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from api.resources import Resources
from producers.settings import Settings
from projections.search.recall.verify import _VERIFY_SQL
from tests.conftest import unique
from tests.support.stores import private_store


def test_every_pooled_connection_of_the_api_takes_generic_plans(base_settings: Settings) -> None:
    settings = base_settings.private(unique("plans"))
    statement = _VERIFY_SQL[(False, True)]  # recall's verification, with a receipt's basis
    params: dict[str, Any] = {
        "tenant": "t",
        "mids": ["m1", "m2"],
        "at": datetime.now(UTC),
        "subject": None,
        "known_at": None,
        "consumer": settings.processor_group,
        "topic": settings.topic,
    }

    async def check() -> tuple[list[str], tuple[int, int]]:
        async with Resources.open(settings, warm_embedder=False) as res:
            async with res.pool.connection() as first, res.pool.connection() as second:  # two sessions
                modes = [(await (await c.execute("SHOW plan_cache_mode")).fetchone())[0] for c in (first, second)]
                for _ in range(7):
                    await (await first.execute(statement, params, prepare=True)).fetchall()
                cur = await first.execute(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE '%%receipt_positions%%' AND statement LIKE '%%access_counts%%'"
                )
                row = await cur.fetchone()
                assert row is not None, "the statement was not prepared"
                return modes, (row[0], row[1])

    with private_store(settings):  # the ledger's tables, empty
        modes, (generic, custom) = asyncio.run(check())
    assert modes == ["force_generic_plan", "force_generic_plan"], modes
    assert (generic, custom) == (7, 0), (generic, custom)

"""A fact about a never-seen entity is found exactly as soon as PostgreSQL holds it; the drainers wake on NOTIFY.

Real stack on private names. The first test runs the projector worker and the app but no indexer: nothing ever
reaches the search index, so an exact hit can only come from PostgreSQL's current state (recall.current), with
every guarantee of the exact tier: the tenant, as_of, erased subjects and retracted facts, the hit's explanation.
The second checks the class: PostgreSQL selects for any exact ask what the index returns, in its order.
The third runs the indexer and the embedder with a 60 s poll interval: a new event is indexed (with its vectors)
within seconds only because each wakes on the NOTIFY of the commit that gave it work (projections.search.drain).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import uuid
from datetime import timedelta
from typing import Any

from elasticsearch import Elasticsearch
from psycopg import sql as psql

from producers.contract import EventType, version_id_for
from producers.settings import Settings
from projections.search.cues import TimeRange, normalize_entity
from projections.search.recall.current import exact_current, exact_current_marked
from projections.search.recall.index import ElasticIndex
from projections.search.recall.model import RecallFilters, Scope
from tests.conftest import unique
from tests.support import Embedder, Indexer, asserted, async_pool, at, erased, marked, pipeline, private_store, wait_for
from tests.support.writer import RecorderWriter, drain_all

H = {"X-API-Key": "dev-key"}  # the default keys: tenants demo, acme and globex
# subjects and entities whose cue form (NFKC, casefold, stripped) is not SQL's `lower(btrim(...))` of them: a sharp
# s, a final sigma, a dotted capital I, a title-case digraph, white space other than a space at an end
FOLDS = [
    ("person:Straße", "Weiß"),
    ("person:Νίκος", "Σωκράτης"),
    ("city:İzmir", "İstanbul"),
    ("person:ǅemal", "ǅ1"),
    ("person:Tab\t", "\u2003Em"),
]
PORT = "project.port"
ALIASES = ["backend port"]


def _fact(entity: str, value: int, day: float, tenant: str = "acme") -> Any:
    return asserted(
        f"project:{entity}",
        PORT,
        value,
        day,
        tenant=tenant,
        entities=[entity],
        aliases=ALIASES,
        content=f"{entity} listens on port {value}",
    )


def _recall(client: Any, tenant: str, query: str, **extra: Any) -> dict[str, Any]:
    r = client.post("/v1/recall", json={"tenant": tenant, "query": query, "mode": "exact", **extra}, headers=H)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_never_seen_entity_is_found_exactly_from_postgresql_before_any_index_has_it(base_settings: Settings) -> None:
    settings = base_settings.private(unique("xc"))
    seed = [_fact("OLD1", 8000, 0), _fact("OLD2", 8001, 0, tenant="globex")]  # the key's alias is known
    with pipeline(settings, seed=seed, indexer=False, app=True) as pipe:
        client = pipe.client
        assert client is not None
        # the API has loaded both tenants' vocabularies: NEW7 and GONE5 are entities it has never seen
        assert _recall(client, "acme", "NEW7 backend port")["cues"]["known_entities"] == []
        assert _recall(client, "globex", "NEW7 backend port")["cues"]["known_entities"] == []

        new = _fact("NEW7", 8443, 10)
        twin = _fact("NEW7", 9999, 10, tenant="globex")  # another tenant's identical entity and key
        gone, retracted = _fact("GONE5", 7000, 10), _fact("RET3", 7001, 10)
        pipe.publish([new, twin, gone, retracted, marked(EventType.RETRACTED, "project:RET3", PORT, 11)])
        pipe.caught_up()  # PostgreSQL holds them; no indexer runs, so the search index has none of them

        for query in ("NEW7 backend port", "NEW7"):  # entity and key; the entity alone
            body = _recall(client, "acme", query)
            (hit,) = body["hits"]
            assert hit["version_id"] == version_id_for("acme", new.event_id) and hit["value"] == 8443
            assert hit["match"]["stage"] == "exact" and hit["score"] >= 1.0  # in the exact band
            assert hit["match"]["verified"] == {"candidate": hit["version_id"]}
            assert set(hit["match"]) == {"stage", "cues", "scores", "verified"}, hit["match"]
            assert "exact_postgres" in body["trace"]["stages_ms"], body["trace"]  # where it came from
        auto = _recall(client, "acme", "NEW7 backend port", mode="auto")
        assert [h["match"]["stage"] for h in auto["hits"]] == ["exact"], auto

        (other,) = _recall(client, "globex", "NEW7 backend port")["hits"]  # each tenant its own
        assert other["version_id"] == version_id_for("globex", twin.event_id) and other["value"] == 9999

        assert _recall(client, "acme", "NEW7 backend port", as_of=at(5).isoformat())["hits"] == []
        assert _recall(client, "demo", "NEW7 backend port")["hits"] == []
        assert _recall(client, "acme", "RET3 backend port")["hits"] == []  # retracted at day 11: forgotten
        (was,) = _recall(client, "acme", "RET3 backend port", as_of=at(10.5).isoformat())["hits"]
        assert was["version_id"] == version_id_for("acme", retracted.event_id)

        (found,) = _recall(client, "acme", "GONE5 backend port")["hits"]
        assert found["version_id"] == version_id_for("acme", gone.event_id)
        pipe.publish([erased("project:GONE5")])
        pipe.caught_up()
        for query in ("GONE5 backend port", "GONE5"):
            assert _recall(client, "acme", query)["hits"] == [], "an erased subject was answered"


def test_the_indexer_and_the_embedder_wake_on_notify_not_on_their_poll(base_settings: Settings) -> None:
    poll = 60.0  # far longer than the bounds below: only a wake-up on NOTIFY meets them
    settings = base_settings.private(unique("wk"))
    with (
        pipeline(settings, seed=[_fact("SEED1", 8000, 0)], indexer=False) as pipe,
        Indexer(settings, indexer_poll_s=poll) as indexer,
        Embedder(settings, embedder_poll_s=poll) as embedder,
        Elasticsearch(settings.es_url, request_timeout=10) as es,
    ):
        pipe.indexer, pipe.embedder = indexer, embedder  # settle() waits for both queues and checks both processes
        pipe.settle(timeout=60)  # the seed: both started with work waiting (no wake-up needed), then sleep
        time.sleep(1)  # both are waiting now
        fresh = _fact("WAKE1", 8080, 1)
        pipe.publish([fresh])
        vid = version_id_for("acme", fresh.event_id)

        def indexed() -> bool:
            indexer.check()
            return bool(es.search(index=settings.es_index, query={"ids": {"values": [vid]}})["hits"]["hits"])

        wait_for(indexed, 10, 0.2, f"the new version to be indexed well before the {poll:g} s poll")
        pipe.settle(timeout=15)  # and its vectors: the embedder woke, then the indexer again for the rewrite


def test_postgresql_answers_every_exact_ask_as_the_index_does(base_settings: Settings) -> None:
    """The class: for any ask (ids, keys, event types, subject, filters, time cue, as_of, known_at), the rows
    recall.current selects in PostgreSQL are the documents the index's exact search returns, in the same order."""
    settings = base_settings.private(unique("xq"))
    with private_store(settings) as (conn, es), RecorderWriter(settings) as w:
        fact = w.assert_fact
        fact("acme", "project:P1", "project.port", "P1 port 8080", 8080, aliases=ALIASES, valid_from=at(0))
        fact("acme", "project:P1", "project.port", "P1 port 9090", 9090, aliases=ALIASES, valid_from=at(5))
        fact("acme", "project:P1", "project.owner", "P1 owner Ann", "ann", valid_from=at(1), tags=["team"])
        fact(
            "acme",
            "order:OD7",
            "order.status",
            "OD7 was refunded",
            "r",
            kind="event",
            entities=["Ｐ１"],
            valid_from=at(2),
        )
        fact("acme", "user:42", "pref.seat", "window seat on P1", "w", entities=["p1", "U42"], valid_from=at(3))
        fact("acme", "user:42", None, "we talked about P1", None, kind="episodic", entities=["P1"], valid_from=at(4))
        fact("globex", "project:P1", "project.port", "P1 port 1", 1, aliases=ALIASES, valid_from=at(0))
        # two episodes in one millisecond (the index keeps milliseconds): ordered by id, not by the microseconds
        later, earlier = next(
            (a, b)
            for a, b in ((uuid.uuid4().hex, uuid.uuid4().hex) for _ in range(100))
            if version_id_for("acme", a) > version_id_for("acme", b)  # the later one sorts last by id
        )
        for eid, us in ((later, 700), (earlier, 200)):
            when = at(3) + timedelta(microseconds=us)
            fact(
                "acme",
                "user:43",
                None,
                f"tie {us}",
                None,
                kind="episodic",
                entities=["P1"],
                valid_from=when,
                event_id=eid,
            )
        w.apply(marked(EventType.RETRACTED, "project:P1", "project.owner", 6))
        for n, (subject, entity) in enumerate(FOLDS):
            fact("acme", subject, PORT, f"{entity} port", n, entities=[entity], valid_from=at(n / 10))
        drain_all(settings, conn, es, None)

        async def compare() -> int:
            from elasticsearch import AsyncElasticsearch

            pool = async_pool(settings)
            await pool.open()
            index = ElasticIndex(AsyncElasticsearch(settings.es_url), settings.es_index)
            compared = 0
            logged = {}
            for tenant in ("acme", "globex"):
                async with pool.connection() as c:
                    cur = await c.execute("SELECT max(seq) FROM vocab_log WHERE tenant = %s", (tenant,))
                    logged[tenant] = (await cur.fetchone())[0]
            assert all(logged.values()), logged  # the drain logged both tenants' versions
            try:
                grid = itertools.product(  # every combination of what an ask can carry, in the acme tenant
                    ("acme",),
                    (("p1",), ("project:p1",), ("u42", "od7")),
                    ((), (PORT,), ("project.owner", "pref.seat")),
                    ((), ("refund",)),
                    (None, "project:P1"),
                    (RecallFilters(), RecallFilters(kind=("state", "event")), RecallFilters(tags=("team",))),
                    (None, TimeRange(at(1.5), at(2.5), "day 2")),
                    (2.5, 5.5),
                    (None, at(4.5)),
                )
                others = [  # another tenant's identical ids, ids nobody has, long after
                    ("globex", ("p1",), (PORT,), (), None, RecallFilters(), None, 30, None),
                    ("globex", ("project:p1",), (), (), None, RecallFilters(), None, 30, at(4.5)),
                    ("acme", ("nobody",), (), (), None, RecallFilters(), None, 30, None),
                    ("acme", ("p1",), (), (), None, RecallFilters(), None, 30, None),
                    # ids as the cues read them (casefold), whatever SQL's `lower` makes of them
                    *(
                        ("acme", (normalize_entity(x),), keys, (), None, RecallFilters(), None, 30, None)
                        for subject, entity in FOLDS
                        for x in (subject, entity, subject.upper(), entity.upper())
                        for keys in ((), (PORT,))
                    ),
                ]
                for tenant, ids, keys, types, subject, filters, time, day, known in [*grid, *others]:
                    scope = Scope(tenant, at(day), subject, filters, time, known_at=known).about(entities=ids)
                    want = await index.exact(scope, keys, types, 20)
                    got = await exact_current(pool, scope, keys, types, 20)
                    assert [c.version_id for c in got] == [c.version_id for c in want], scope
                    # the same answer with the newest vocab_log sequence read in the statement (the recall's check
                    # of its cues), which every row carries: None only when no row came back
                    marked_got, newest = await exact_current_marked(pool, scope, keys, types, 20)
                    assert [c.version_id for c in marked_got] == [c.version_id for c in want], scope
                    assert newest in (logged[tenant], None) and (newest is None) <= (not want), (newest, scope)
                    compared += bool(want)
            finally:
                await index.es.close()
                await pool.close()
            return compared

        assert asyncio.run(compare()) > 200  # most asks find something: not a comparison of empty lists


def test_the_about_index_keeps_no_pending_list_and_a_schema_made_before_gets_its_about_once(
    base_settings: Settings,
) -> None:
    """A GIN index's fast-update list is scanned whole by every lookup until a vacuum merges it: under steady ingest
    exact asks slowed as the ledger grew. The index over `about` is made without it; the indexes over SQL functions
    it replaces (and the functions) are dropped from a schema made before, whose rows get their `about` once, as
    the recorder writes it."""
    import psycopg

    from projections.postgres.schema import create_schema

    settings = base_settings.private(unique("gin"))
    schema = settings.pg_schema
    indexes = "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace " + (
        "WHERE n.nspname = %s AND c.relname LIKE 'fact_versions_%%' AND c.relam = (SELECT oid FROM pg_am "
        "WHERE amname = 'gin') ORDER BY 1"
    )
    functions = "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s"
    with private_store(settings) as (conn, _), RecorderWriter(settings) as w:
        for n, (subject, entity) in enumerate(FOLDS):
            w.assert_fact("acme", subject, PORT, f"{entity} port", n, entities=[entity], valid_from=at(n))
        written = conn.execute("SELECT version_id, about FROM fact_versions ORDER BY 1").fetchall()
        assert len(written) == len(FOLDS) and all(about for _, about in written)
        with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
            assert admin.execute(indexes, (schema,)).fetchall() == [("fact_versions_about_ids", ["fastupdate=off"])]
            for name, args, body in (  # as a schema made before had them, and its rows without `about`
                ("fact_ids", "subject text, entities text[]", "entities || subject"),
                ("fact_about", "subject text, entities text[], key text", "entities || subject || key"),
            ):
                admin.execute(
                    f'CREATE FUNCTION "{schema}".{name}({args}) RETURNS text[] LANGUAGE sql IMMUTABLE AS $$ SELECT '
                    f"{body} $$"
                )
            admin.execute(
                f'CREATE INDEX fact_versions_ids ON "{schema}".fact_versions USING gin '
                f'("{schema}".fact_ids(subject, entities))'
            )
            admin.execute(
                f'CREATE INDEX fact_versions_about ON "{schema}".fact_versions USING gin '
                f'("{schema}".fact_about(subject, entities, key))'
            )
            admin.execute(f'UPDATE "{schema}".fact_versions SET about = NULL')
            admin.execute(f"DELETE FROM \"{schema}\".meta WHERE name = 'version_about'")
            assert len(admin.execute(indexes, (schema,)).fetchall()) == 3
            create_schema(admin, schema)
            assert admin.execute(indexes, (schema,)).fetchall() == [("fact_versions_about_ids", ["fastupdate=off"])]
            assert not {"fact_ids", "fact_about"} & {r[0] for r in admin.execute(functions, (schema,)).fetchall()}
        assert conn.execute("SELECT version_id, about FROM fact_versions ORDER BY 1").fetchall() == written


def test_an_ask_naming_a_key_is_not_confused_by_colons_in_ids_or_keys(base_settings: Settings) -> None:
    """The (id, key) pairs are looked up as `length:id:key`: without the length, `p1` with key `x:y` and `p1:x`
    with key `y` would both be `p1:x:y`, and the newer (the wrong one) would take the only place of size 1."""
    settings = base_settings.private(unique("xk"))
    with private_store(settings), RecorderWriter(settings) as w:
        w.assert_fact("acme", "project:A1", "x:y", "a1", 1, entities=["p1"], valid_from=at(1))
        w.assert_fact("acme", "project:B1", "y", "b1", 2, entities=["p1:x"], valid_from=at(2))  # newer

        async def ask(ids: tuple[str, ...], keys: tuple[str, ...]) -> list[str]:
            pool = async_pool(settings)
            await pool.open()
            try:
                found = await exact_current(pool, Scope("acme", at(3)).about(entities=ids), keys, (), 1)
            finally:
                await pool.close()
            return [c.memory_id for c in found]

        (a1,) = asyncio.run(ask(("p1",), ("x:y",)))
        (b1,) = asyncio.run(ask(("p1:x",), ("y",)))
        assert a1 != b1
        assert asyncio.run(ask(("p1",), ("y",))) == [] and asyncio.run(ask(("p1:x",), ("x:y",))) == []


def _prepared(sql: str, params: dict[str, Any]) -> tuple[str, str]:
    """`sql` with psycopg's %(name)s placeholders as a PREPARE of $n ones, and its EXECUTE with `params` as
    literals: the server plans the prepared statement as the API's pool does (a generic plan), not the values."""
    names: list[str] = []

    def number(match: Any) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", number, sql)
    values = psql.SQL(", ").join(psql.Literal(params[n]) for n in names)
    return f"PREPARE ask AS {prepared}", psql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE ask({})").format(values)


def test_an_ask_naming_a_key_reads_that_keys_versions_not_every_version_of_a_heavy_entity(
    base_settings: Settings,
) -> None:
    """The class: an exact ask's cost does not grow with how much else is known about the entity. One entity with
    2,000 facts of 2,000 keys: under the generic plan the API's connections run, an ask for one key reads the one
    version of that key through the about index (an ask by the entity alone still finds its newest, all of them
    candidates)."""
    import psycopg

    from projections.postgres.connection import GENERIC_PLANS
    from projections.search.recall.current import _query

    settings = base_settings.private(unique("xh"))
    with private_store(settings) as (conn, _), RecorderWriter(settings) as w:
        w.apply(*(asserted("project:HEAVY", f"k{i:04d}", i, i / 1000, tenant="acme") for i in range(2000)))
        conn.execute("ANALYZE fact_versions")
        with psycopg.connect(settings.pg_dsn, autocommit=True) as c:
            c.execute(GENERIC_PLANS)
            c.execute(f'SET search_path TO "{settings.pg_schema}"')

            def scans(keys: tuple[str, ...]) -> list[dict[str, Any]]:
                scope = Scope("acme", at(30)).about(entities=("project:heavy", "heavy"))
                prepare, explain = _prepared(*_query(scope, keys, (), 20))
                c.execute("DEALLOCATE ALL")
                c.execute(prepare)
                plan = c.execute(explain).fetchone()[0][0]["Plan"]
                nodes, found = [plan], []
                while nodes:
                    node = nodes.pop()
                    nodes += node.get("Plans", [])
                    if "Scan" in node["Node Type"]:
                        found.append(node)
                return found

            keyed = scans(("k0042",))
            assert {n["Index Name"] for n in keyed if "Index Name" in n} == {"fact_versions_about_ids"}, keyed
            heap = [n for n in keyed if n["Node Type"] in ("Bitmap Heap Scan", "Index Scan")]
            assert [n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in heap] == [1], heap
        found = asyncio.run(_newest(settings))
        assert len(found) == 20


async def _newest(settings: Settings) -> list[Any]:
    pool = async_pool(settings)
    await pool.open()
    try:
        scope = Scope("acme", at(30)).about(entities=("heavy",))
        return await exact_current(pool, scope, (), (), 20)
    finally:
        await pool.close()

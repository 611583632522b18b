-- The PostgreSQL projection (docs/INTERNALS.md). Run by projections.postgres.schema.create_schema
-- with search_path set to the projection's schema; every statement is idempotent.

-- Layout 2: events keyed by (tenant, event_id), fingerprints, erased_events, meta.
-- A schema of an older layout is not migrated in place: `ledger rebuild` replays it into this one.

-- once per schema: the layout and the salt of erased_events (random, never shown, kept by rebuild)
CREATE TABLE IF NOT EXISTS meta (
    name   text PRIMARY KEY,
    value  text NOT NULL
);
INSERT INTO meta (name, value) VALUES ('layout', '2') ON CONFLICT DO NOTHING;
INSERT INTO meta (name, value)
    VALUES ('erasure_salt', replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''))
    ON CONFLICT DO NOTHING;

-- event ids are the producer's idempotency keys, scoped by tenant: (tenant, event_id) is the key
CREATE TABLE IF NOT EXISTS events (
    tenant       text NOT NULL,
    event_id     text NOT NULL,
    fingerprint  text NOT NULL,              -- MemoryEvent.fingerprint: same id + other content = conflict
    subject      text NOT NULL,
    memory_id    text,                       -- NULL for subject.erased
    type         text NOT NULL,
    kind         text NOT NULL,
    key          text,
    scope        text NOT NULL DEFAULT '',
    "partition"  integer NOT NULL,
    "offset"     bigint NOT NULL,
    observed_at  timestamptz NOT NULL,
    valid_from   timestamptz,
    valid_to     timestamptz,
    target_version text,                     -- memory.retracted of one version (its version_id)
    payload      jsonb NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),  -- wall clock: not part of the checksum
    PRIMARY KEY (tenant, event_id),
    UNIQUE ("partition", "offset")
);
CREATE INDEX IF NOT EXISTS events_subject_ledger ON events (tenant, subject, "partition", "offset");
CREATE INDEX IF NOT EXISTS events_subject_time ON events (tenant, subject, observed_at);
-- retractions and confirmations of a fact, re-read when its chain is recomputed
CREATE INDEX IF NOT EXISTS events_marks ON events (memory_id)
    WHERE type IN ('memory.retracted', 'memory.confirmed');
-- the console's subject finder: prefix ranges in code point order (projections.postgres.subject_search)
CREATE INDEX IF NOT EXISTS events_subject_c ON events (tenant, subject COLLATE "C");

CREATE TABLE IF NOT EXISTS fact_versions (
    version_id        text PRIMARY KEY,      -- version_id_for(tenant, event_id): unique across tenants
    event_id          text NOT NULL,         -- the assertion's event_id, as its producer chose it
    memory_id         text NOT NULL,
    tenant            text NOT NULL,
    subject           text NOT NULL,
    key               text,
    scope             text NOT NULL DEFAULT '',
    kind              text NOT NULL,
    value             jsonb,
    content           text NOT NULL,
    entities          text[] NOT NULL DEFAULT '{}',
    aliases           text[] NOT NULL DEFAULT '{}',
    tags              text[] NOT NULL DEFAULT '{}',
    source            jsonb NOT NULL DEFAULT '{}',
    confidence        double precision NOT NULL,
    importance        double precision NOT NULL,
    observed_at       timestamptz NOT NULL,
    valid_from        timestamptz NOT NULL,
    valid_to          timestamptz,           -- effective end (a retraction sets it)
    asserted_valid_to timestamptz,           -- valid_to as the event asserted it (never changed)
    status            text NOT NULL CHECK (status IN ('active', 'superseded', 'retracted')),
    superseded_by     text,
    superseded_at     timestamptz,
    version           integer NOT NULL CHECK (version >= 1),
    confirmed_count   integer NOT NULL DEFAULT 0,
    last_confirmed_at timestamptz,
    "partition"       integer NOT NULL,
    "offset"          bigint NOT NULL,
    CHECK ((superseded_by IS NULL) = (superseded_at IS NULL)),
    CHECK ((source->>'type') IS DISTINCT FROM 'explicit' OR confidence = 1.0)
);
-- invariant 1: at most one active, open-ended, non-superseded version per fact
CREATE UNIQUE INDEX IF NOT EXISTS fact_versions_one_current ON fact_versions (memory_id)
    WHERE status = 'active' AND valid_to IS NULL AND superseded_by IS NULL;
-- a fact's chain by memory_id alone, its order (version) sorted per ask: a renumbering (a late version lands before
-- others), a confirmation or a new revision then changes no indexed column, and with the page's free room below the
-- update stays on its page (HOT) and writes no index entry
CREATE INDEX IF NOT EXISTS fact_versions_chain ON fact_versions (memory_id);
DROP INDEX IF EXISTS fact_versions_memory;
DO $$
BEGIN
    IF NOT coalesce((SELECT 'fillfactor=90' = ANY (reloptions) FROM pg_class WHERE oid = 'fact_versions'::regclass),
                    false) THEN
        ALTER TABLE fact_versions SET (fillfactor = 90);
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS fact_versions_subject ON fact_versions (tenant, subject, memory_id);

CREATE TABLE IF NOT EXISTS search_outbox (
    id          bigserial PRIMARY KEY,
    version_id  text,                        -- NULL for delete_subject
    tenant      text NOT NULL,
    subject     text NOT NULL,
    op          text NOT NULL CHECK (op IN ('upsert', 'delete_subject')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS positions (
    consumer     text NOT NULL,
    topic        text NOT NULL,
    "partition"  integer NOT NULL,
    next_offset  bigint NOT NULL CHECK (next_offset >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, "partition")
);

CREATE TABLE IF NOT EXISTS dead_letters (
    topic        text NOT NULL,
    "partition"  integer NOT NULL,
    "offset"     bigint NOT NULL,
    code         text NOT NULL,
    field        text,
    message      text NOT NULL,
    raw          bytea,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, "partition", "offset")
);

-- the event ids of erased subjects, as sha256(salt || event_id): a re-sent pre-erasure event has
-- no effect, and the ids themselves are gone with the subject (not part of the checksum)
CREATE TABLE IF NOT EXISTS erased_events (
    tenant   text NOT NULL,
    id_hash  bytea NOT NULL,
    PRIMARY KEY (tenant, id_hash)
);

-- Access tracking: the projection of the access topic (projections.postgres.accesses), written by
-- the worker's access agent with its positions in `positions` (consumer = the group, topic = the access topic),
-- so each record counts once. Additive: an existing layout-2 schema gets these tables on the next start.
-- `accesses`: one row per access id (a redelivery is a no-op); no content, subject or key, ids are digests.
CREATE TABLE IF NOT EXISTS accesses (
    tenant       text NOT NULL,
    access_id    text NOT NULL,             -- contract.access_id_for(tenant, caller, serving, memory_id, version_id)
    memory_id    text NOT NULL,
    version_id   text NOT NULL,
    stage        text NOT NULL,
    via          text NOT NULL,
    caller       text NOT NULL,             -- a fingerprint of the API key, never the key
    request_id   text,
    accessed_at  timestamptz NOT NULL,
    "partition"  integer NOT NULL,
    "offset"     bigint NOT NULL,
    PRIMARY KEY (tenant, access_id)
);
CREATE INDEX IF NOT EXISTS accesses_version ON accesses (version_id);  -- an erasure removes its versions' accesses
-- per fact: how often and how lately it was served (recall's prior reads it; a function of `accesses`)
CREATE TABLE IF NOT EXISTS access_counts (
    tenant            text NOT NULL,
    memory_id         text NOT NULL,
    accesses          bigint NOT NULL CHECK (accesses > 0),
    last_accessed_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, memory_id)
);
-- /v1/stats' most-served facts: the first rows of this index, in the order queries.access_summary sorts them
CREATE INDEX IF NOT EXISTS access_counts_most ON access_counts (tenant, accesses DESC, last_accessed_at DESC, memory_id);
-- the version ids of erased subjects, as sha256(salt || version_id) (the erasure salt of `meta`): an access of
-- an erased version that arrives after the erasure (a lagging projector, a replay) is dropped, not counted
CREATE TABLE IF NOT EXISTS erased_versions (
    tenant   text NOT NULL,
    id_hash  bytea NOT NULL,
    PRIMARY KEY (tenant, id_hash)
);

-- two-phase indexing (projections.search.indexer writes documents, projections.search.embedder vectors).
-- `rev` is the version's document revision: every change of what its search document holds draws a new one (the
-- recorder's status updates, an embedder storing its vectors), so Elasticsearch keeps the newest state of a document
-- whichever of several indexers writes last (external_gte versions). It starts high, above the write counts that
-- were the documents' versions before; `ledger rebuild` starts a rebuilt schema's sequence past the live one's.
CREATE SEQUENCE IF NOT EXISTS doc_rev START WITH 1000000;
ALTER TABLE fact_versions ADD COLUMN IF NOT EXISTS rev bigint NOT NULL DEFAULT nextval('doc_rev');
-- a version's vectors, one per vector field, with the model that made it (float32 little-endian, unit length);
-- kept with the version (an erasure deletes them with it) so a reindex need not embed again
CREATE TABLE IF NOT EXISTS version_vectors (
    version_id  text NOT NULL REFERENCES fact_versions (version_id) ON DELETE CASCADE,
    field       text NOT NULL,
    model       text NOT NULL,
    vec         bytea NOT NULL,
    PRIMARY KEY (version_id, field)
);
-- versions whose document lacks a vector of the configured models: the embedders' work, claimed FOR UPDATE SKIP
-- LOCKED; `since` is when PostgreSQL had the version (its outbox row's time): the semantic lag starts there
CREATE TABLE IF NOT EXISTS embed_queue (
    id          bigserial PRIMARY KEY,
    version_id  text NOT NULL UNIQUE,
    tenant      text NOT NULL,
    since       timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS embed_queue_tenant ON embed_queue (tenant, id);
-- the oldest pending row of a tenant (`/v1/stats`' document lag), and every other look-up by tenant: an index on
-- (tenant) alone would only cost each queued and consumed row one more index entry
CREATE INDEX IF NOT EXISTS search_outbox_tenant_id ON search_outbox (tenant, id);
DROP INDEX IF EXISTS search_outbox_tenant;
-- an embedder's row (a document to write again with its new vectors) waits behind every new version's: a new fact
-- is never queued behind a backlog of vector rewrites (the indexers claim in (priority, id) order)
ALTER TABLE search_outbox ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS search_outbox_claim ON search_outbox (priority, id);
-- the tenants whose new versions wait, and each one's oldest (the indexers share a batch among them,
-- projections.search.claims.claim_fairly): search_outbox_tenant_id would walk a tenant's vector rewrites too
CREATE INDEX IF NOT EXISTS search_outbox_first ON search_outbox (tenant, id) WHERE priority = 0;
-- the log position of the record a queued row stands for (the event of its version, a subject's erasure; NULL: queued
-- before the columns), so that a read waiting for one write (api.consistency) waits for that write's rows only,
-- not for whatever its tenant wrote after it: a partition's rows are queued in its log order
ALTER TABLE search_outbox ADD COLUMN IF NOT EXISTS "partition" integer, ADD COLUMN IF NOT EXISTS "offset" bigint;
ALTER TABLE embed_queue ADD COLUMN IF NOT EXISTS "partition" integer, ADD COLUMN IF NOT EXISTS "offset" bigint;
CREATE INDEX IF NOT EXISTS search_outbox_place ON search_outbox (tenant, "partition", "offset");
CREATE INDEX IF NOT EXISTS embed_queue_place ON embed_queue (tenant, "partition", "offset");

-- /v1/stats' counters (projections.postgres.counts): per tenant and name (events, versions, outbox,
-- dead_letters/<topic> under tenant ''), written by the recorder and the indexer in the transactions that write
-- the rows they count; a count is the sum over its shards (a shard per writer: see counts.py). Additive: a
-- layout-2 schema that predates the table is counted once, on the next start, with its writers held off.
CREATE TABLE IF NOT EXISTS counts (
    tenant  text NOT NULL,
    name    text NOT NULL,
    shard   integer NOT NULL,
    n       bigint NOT NULL,
    PRIMARY KEY (tenant, name, shard)
);
-- the tenant a dead letter's record names (see below, with its event_id), read by the recount as well
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS tenant text;
-- what the counters must equal: GET /v1/stats/consistency compares them, the one-time backfill below uses it
CREATE OR REPLACE VIEW counts_recount AS
    SELECT tenant, 'events' AS name, count(*) AS n FROM events GROUP BY tenant
    UNION ALL SELECT tenant, 'versions', count(*) FROM fact_versions GROUP BY tenant
    UNION ALL SELECT tenant, 'outbox', count(*) FROM search_outbox GROUP BY tenant
    UNION ALL SELECT tenant, 'embed_queue', count(*) FROM embed_queue GROUP BY tenant
    -- a dead letter under the tenant it names (NULL: none readable, counted under '' and no tenant's)
    UNION ALL SELECT coalesce(tenant, ''), 'dead_letters/' || topic, count(*) FROM dead_letters
        GROUP BY coalesce(tenant, ''), topic
    -- /v1/stats' access counters (projections.postgres.accesses): facts with an active version, those of them
    -- with accesses, and their accesses
    UNION ALL SELECT f.tenant, x.name, CASE x.name WHEN 'facts_active' THEN count(*)
                                                   WHEN 'facts_active_served' THEN count(a.memory_id)
                                                   ELSE coalesce(sum(a.accesses), 0)::bigint END
        FROM (SELECT DISTINCT tenant, memory_id FROM fact_versions WHERE status = 'active') f
        LEFT JOIN access_counts a ON a.tenant = f.tenant AND a.memory_id = f.memory_id
        CROSS JOIN (VALUES ('facts_active'), ('facts_active_served'), ('accesses_active')) AS x(name)
        GROUP BY f.tenant, x.name;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM meta WHERE name = 'counts') THEN
        LOCK TABLE events, fact_versions, search_outbox, dead_letters IN SHARE MODE;
        DELETE FROM counts;
        INSERT INTO counts (tenant, name, shard, n) SELECT tenant, name, 0, n FROM counts_recount;
        INSERT INTO meta (name, value) VALUES ('counts', 'recounted at ' || now());
    END IF;
END $$;
-- the access counters, once, in a schema whose counters predate them (a fresh schema counts zero rows here)
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM meta WHERE name = 'counts_access') THEN
        LOCK TABLE fact_versions, access_counts IN SHARE MODE;
        DELETE FROM counts WHERE name IN ('facts_active', 'facts_active_served', 'accesses_active');
        INSERT INTO counts (tenant, name, shard, n) SELECT tenant, name, 0, n FROM counts_recount
            WHERE name IN ('facts_active', 'facts_active_served', 'accesses_active');
        INSERT INTO meta (name, value) VALUES ('counts_access', 'recounted at ' || now());
    END IF;
END $$;
-- the dead-letter counters per tenant named, once, in a schema whose counters kept them all under ''
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM meta WHERE name = 'counts_dead_letters') THEN
        LOCK TABLE dead_letters IN SHARE MODE;
        DELETE FROM counts WHERE name LIKE 'dead\_letters/%';
        INSERT INTO counts (tenant, name, shard, n) SELECT tenant, name, 0, n FROM counts_recount
            WHERE name LIKE 'dead\_letters/%';
        INSERT INTO meta (name, value) VALUES ('counts_dead_letters', 'recounted at ' || now());
    END IF;
END $$;
-- versions breaking a row-local rule of /v1/stats' invariants (normally none, so counting them reads an empty
-- index); the predicate is projections.postgres.stats.SUSPECT, word for word, so the planner uses the index
CREATE INDEX IF NOT EXISTS fact_versions_suspect ON fact_versions (tenant) WHERE
    (status = 'superseded' AND superseded_by IS NULL) OR (status = 'active' AND superseded_by IS NOT NULL)
    OR ((superseded_by IS NULL) <> (superseded_at IS NULL))
    OR ((source->>'type') = 'explicit' AND confidence <> 1.0);

-- the data key that sealed each event (NULL: a clear record); an erasure record counts both kinds
ALTER TABLE events ADD COLUMN IF NOT EXISTS key_id text;
-- an erasure's log timestamp (NULL on other events, and on an erasure logged before this column: the later of its
-- observed_at and recorded_at stands for it): orders it against its subject's records in other partitions, which
-- have no offset order with it
ALTER TABLE events ADD COLUMN IF NOT EXISTS logged_at timestamptz;
-- every record of a batch asks whether its subject has an erasure: the tombstones alone, not each subject's events
CREATE INDEX IF NOT EXISTS events_erasures ON events (tenant, subject) WHERE type = 'subject.erased';

-- what the indexer has made searchable, in order (projections.search.vocab): each API process reads only
-- the rows after its watermark into the tenant's cue vocabulary, so a new entity or alias is a cue for the first
-- recall after its document is indexed, with no TTL. The indexer keeps the newest rows only (VOCAB_LOG_KEEP); an
-- API process whose watermark is older than the oldest row reloads the tenant whole.
CREATE TABLE IF NOT EXISTS vocab_log (
    seq         bigserial PRIMARY KEY,
    tenant      text NOT NULL,
    version_id  text NOT NULL
);
CREATE INDEX IF NOT EXISTS vocab_log_tenant ON vocab_log (tenant, seq);


-- near-duplicate episodes (projections.search.duplicates). An episode that repeats one already stored
-- (the same thing said again, a re-import) is linked to that episode's group when its vectors are stored, never
-- deleted: recall returns one hit per group and lists the others. `group_id` is the group's first episode (not a
-- foreign key: a group outlives an erased first member); the measures that decided it are kept.
CREATE TABLE IF NOT EXISTS episode_links (
    version_id  text PRIMARY KEY REFERENCES fact_versions (version_id) ON DELETE CASCADE,
    tenant      text NOT NULL,
    group_id    text NOT NULL,
    cosine      real NOT NULL,
    text_similarity real NOT NULL,
    linked_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS episode_links_group ON episode_links (tenant, group_id);

-- an episode hit's neighbouring turns (projections.search.recall.neighbours): the episodes of a tenant in
-- time order, read only when a recall asks for context turns
CREATE INDEX IF NOT EXISTS fact_versions_episode_time ON fact_versions (tenant, observed_at, version_id)
    WHERE kind = 'episodic';

-- One content per (tenant, event_id) across every door (projections.postgres.idempotency.claim_events): a door
-- claims the id with its event's fingerprint (MemoryEvent.fingerprint) in one statement before it publishes, so
-- two API processes or the HTTP and MCP doors racing on one id with two contents answer one of them
-- event_id_conflict instead of both "accepted". Ids and fingerprints only, never content; an erasure deletes the
-- claims of the subject's events (erased_events answers for them). Additive, as the tables above.
CREATE TABLE IF NOT EXISTS event_claims (
    tenant       text NOT NULL,
    event_id     text NOT NULL,
    fingerprint  text NOT NULL,
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, event_id)
);
-- the erased event's fingerprint as sha256(salt || fingerprint || event_id): the same content re-sent is a
-- duplicate, other content under the erased id a conflict; NULL for ids erased before the column (then: duplicate)
ALTER TABLE erased_events ADD COLUMN IF NOT EXISTS fp_hash bytea;
-- a refused record's tenant and event_id as it claims them (producers.logs.record_ids), NULL when unreadable: the
-- fate of an event by its id (GET /v1/events/{event_id}) includes its dead letters
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS tenant text;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS event_id text;
CREATE INDEX IF NOT EXISTS dead_letters_event ON dead_letters (tenant, event_id) WHERE event_id IS NOT NULL;

-- What each version is about, normalized as recall's cues are (projections.search.cues.about_entries: its subject's
-- ids and its entities in the cues' normal form), for recall's exact stage to find it in PostgreSQL before the search
-- index has its document (projections.search.recall.current): each id as `length:id`, and, when the version has a
-- key, each id with it as `length:id:key` (the length makes either spelling unambiguous whatever id and key hold). An
-- ask naming keys looks up the pairs, so it reads the versions of those keys, not every version of a heavy entity.
-- Written by the recorder in Python, whose casefold SQL's `lower` is not (`ß`, a final `ς`, a dotted `İ`, white
-- space other than spaces); in a schema whose rows predate the column, filled once by projections.postgres.schema.
-- Without the fast-update pending list: under steady ingest every lookup scanned the list (up to 4 MB) before the
-- index. The indexes over the SQL functions it replaces are dropped (docs/INTERNALS.md, "Exact answers from
-- PostgreSQL").
ALTER TABLE fact_versions ADD COLUMN IF NOT EXISTS about text[];
CREATE INDEX IF NOT EXISTS fact_versions_about_ids ON fact_versions USING gin (about) WITH (fastupdate = off);
DROP INDEX IF EXISTS fact_versions_about;
DROP FUNCTION IF EXISTS fact_about(text, text[], text);
DROP INDEX IF EXISTS fact_versions_ids;
DROP FUNCTION IF EXISTS fact_ids(text, text[]);

-- What became of a dead letter (the dead-letter workflow, api/reads.py and api/writes.py): one row per letter and
-- tenant, written by the recorder in the transaction of the event that resolves it (an event carrying
-- `dead_letter`: the corrected record re-driven, or `deadletter.discarded` with its reason). Keyed by the letter's
-- position and the resolving event's tenant, not a reference to `dead_letters`: a rebuild may apply the resolution
-- before the letter's own partition, and only a letter of the same tenant is resolved by it (the listing joins on
-- both). Of several resolutions the one first in ledger position is kept, whatever the order they are applied in,
-- so a redelivery or a rebuild gives the same row. No row is deleted: the letter and its resolution stay.
CREATE TABLE IF NOT EXISTS dead_letter_resolutions (
    topic          text NOT NULL,
    "partition"    integer NOT NULL,
    "offset"       bigint NOT NULL,
    tenant         text NOT NULL,
    state          text NOT NULL CHECK (state IN ('redriven', 'discarded')),
    event_id       text NOT NULL,
    by_partition   integer NOT NULL,
    by_offset      bigint NOT NULL,
    reason         text,
    resolved_at    timestamptz NOT NULL,
    PRIMARY KEY (topic, "partition", "offset", tenant)
);
-- event_id and reason NULL: the resolving event's subject was erased since; the letter stays resolved (an action on
-- it is refused as on any resolved letter), by an event whose id and reason went with its subject
ALTER TABLE dead_letter_resolutions ALTER COLUMN event_id DROP NOT NULL;
-- the subject a refused record names (its event's, or as its JSON claims it): the subject's erasure takes its
-- letters, as a replay, which cannot open a record sealed with the destroyed key, never makes them (NULL: a letter
-- recorded before the column, or a record that names none)
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS subject text;
CREATE INDEX IF NOT EXISTS dead_letters_subject ON dead_letters (tenant, subject) WHERE subject IS NOT NULL;
CREATE INDEX IF NOT EXISTS dead_letters_tenant ON dead_letters (tenant, "partition", "offset") WHERE tenant IS NOT NULL;

-- The ledger chain (projections.postgres.chain, docs/INTERNALS.md "The chain"): per (consumer, topic, partition) the
-- link of the last record the projection took (sha256 over the previous link, the position, the key and the value
-- bytes as they stand in the log), that record's offset, how many records the chain holds and the offset it began at
-- (0, unless the schema predates the chain: then where the projection stood when it first chained). Written in the
-- batch's transaction with the positions, so it covers exactly the records the positions say were taken. Additive:
-- an existing schema gets the tables on the next start; `ledger rebuild` chains the ledger from offset 0.
CREATE TABLE IF NOT EXISTS chain_heads (
    consumer      text NOT NULL,
    topic         text NOT NULL,
    "partition"   integer NOT NULL,
    head          bytea NOT NULL,
    "offset"      bigint NOT NULL,
    count         bigint NOT NULL CHECK (count >= 1),
    first_offset  bigint NOT NULL,
    PRIMARY KEY (consumer, topic, "partition")
);
-- every record's own link (the chain's value after it), written with the head: a receipt (api.receipts) cites the
-- link of the event behind each version it shows, and checking it needs no re-read of the log. Hashes only: a link
-- is over the record's bytes as logged (sealed when encryption is on), so an erasure keeps it
CREATE TABLE IF NOT EXISTS chain_links (
    consumer      text NOT NULL,
    topic         text NOT NULL,
    "partition"   integer NOT NULL,
    "offset"      bigint NOT NULL,
    link          bytea NOT NULL,
    PRIMARY KEY (consumer, topic, "partition", "offset")
);
-- heads signed with the worker's Ed25519 key (producers.keys.signing) every chain_checkpoint_records records or
-- chain_checkpoint_s seconds; the public key is stored with each, so verifying needs no secret. `ledger rebuild`
-- carries the live checkpoints over (the attestations of the past are kept, not replaced by the replay's).
CREATE TABLE IF NOT EXISTS chain_checkpoints (
    consumer      text NOT NULL,
    topic         text NOT NULL,
    "partition"   integer NOT NULL,
    count         bigint NOT NULL,
    "offset"      bigint NOT NULL,
    first_offset  bigint NOT NULL,
    head          bytea NOT NULL,
    key_id        text NOT NULL,
    public_key    bytea NOT NULL,
    signature     bytea NOT NULL,
    signed_at     timestamptz NOT NULL DEFAULT now(),  -- wall clock, not signed
    PRIMARY KEY (consumer, topic, "partition", first_offset, count)
);
-- where each partition's chain began in a schema that predates the chain: its positions when the chain tables came
-- (a fresh schema has none: every chain begins at offset 0). `ledger verify` tells records before it from a chain
-- that is missing.
CREATE TABLE IF NOT EXISTS chain_starts (
    consumer      text NOT NULL,
    topic         text NOT NULL,
    "partition"   integer NOT NULL,
    first_offset  bigint NOT NULL,
    PRIMARY KEY (consumer, topic, "partition")
);
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM meta WHERE name = 'chain') THEN
        INSERT INTO chain_starts (consumer, topic, "partition", first_offset)
            SELECT consumer, topic, "partition", next_offset FROM positions WHERE next_offset > 0;
        INSERT INTO meta (name, value) VALUES ('chain', 'began at ' || now());
    END IF;
END $$;

-- What a receipt (api.receipts) cites of a version, on its row: its event's fingerprint and its record's chain link,
-- written by the recorder in the insert of the row (copies of `events.fingerprint` and `chain_links.link`), so that
-- recall's verification reads them as columns of the rows it reads anyway instead of probing `events` and
-- `chain_links` for every candidate. A NULL fingerprint: a row written without them (by a process of the step
-- before, or a schema's own insert); its receipt reads the events row instead (projections.postgres.receipts.Basis).
-- `link` NULL with a fingerprint: the record was taken before the chain began (as `chain_links` has no row for it).
ALTER TABLE fact_versions ADD COLUMN IF NOT EXISTS fingerprint text;
ALTER TABLE fact_versions ADD COLUMN IF NOT EXISTS link bytea;
-- once, in a schema whose rows predate the columns: filled from `events` and the chain's links (only when a single
-- consumer chains the schema, as the recorder does: else they stay NULL and their receipts read the events rows)
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM meta WHERE name = 'version_citations') THEN
        IF (SELECT count(DISTINCT (consumer, topic)) FROM chain_heads) <= 1 THEN
            UPDATE fact_versions f SET fingerprint = e.fingerprint, link = l.link
                FROM events e LEFT JOIN chain_links l ON (l.consumer, l.topic) = (SELECT consumer, topic FROM chain_heads LIMIT 1)
                    AND l."partition" = e."partition" AND l."offset" = e."offset"
                WHERE e.tenant = f.tenant AND e.event_id = f.event_id AND f.fingerprint IS NULL;
        END IF;
        INSERT INTO meta (name, value) VALUES ('version_citations', 'filled at ' || now());
    END IF;
END $$;

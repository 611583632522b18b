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
CREATE INDEX IF NOT EXISTS fact_versions_memory ON fact_versions (memory_id, version);
CREATE INDEX IF NOT EXISTS fact_versions_subject ON fact_versions (tenant, subject, memory_id);

CREATE TABLE IF NOT EXISTS search_outbox (
    id          bigserial PRIMARY KEY,
    version_id  text,                        -- NULL for delete_subject
    tenant      text NOT NULL,
    subject     text NOT NULL,
    op          text NOT NULL CHECK (op IN ('upsert', 'delete_subject')),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS search_outbox_tenant ON search_outbox (tenant);

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

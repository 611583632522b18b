-- The key store and the erasure records (producers/keys/store.py), in their own schema (Settings.keys_schema):
-- not a projection, so `ledger rebuild` never drops or rewrites them. Run with search_path on that schema;
-- every statement is idempotent.

-- one check value per key-encryption key: a wrong key under a known id fails at start, not per record
CREATE TABLE IF NOT EXISTS kek_checks (
    kek_id       text PRIMARY KEY,
    check_value  bytea NOT NULL,            -- AES-GCM of a constant under the KEK
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- one digest key per tenant: the HMAC-SHA256 key of its subject digests (store.SubjectDigests). A tenant's, not a
-- subject's: it outlives every erasure, so whoever knows a subject can still find its erasure record, and nobody
-- without the key can test candidate ids against a digest. Wrapped by the KEK when one is configured (kek_id set);
-- with encryption off and no KEK it is kept clear (kek_id NULL) and wrapped by the first process that has a KEK.
CREATE TABLE IF NOT EXISTS digest_keys (
    tenant      text PRIMARY KEY,
    kek_id      text,                       -- the KEK that wraps it; NULL: the key itself, clear
    secret      bytea NOT NULL,             -- nonce + AES-GCM(key), AAD = tenant; or the 32-byte key when clear
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS digest_keys_kek ON digest_keys (kek_id);

-- one data key per (tenant, subject) at a time; the subject only as its keyed digest (SubjectDigests; rows written
-- before keyed digests hold contract.subject_digest_for, which lookups still match)
CREATE TABLE IF NOT EXISTS data_keys (
    key_id          text PRIMARY KEY,       -- random 32 hex: the envelope's "kid"
    tenant          text NOT NULL,
    subject_digest  text NOT NULL,
    kek_id          text,                   -- the KEK that wraps it; NULL once destroyed
    wrapped         bytea,                  -- nonce + AES-GCM(data key), AAD = key id, tenant, digest; NULL once destroyed
    fingerprint     text NOT NULL,          -- envelope.fingerprint_of(data key): names it in the erasure record
    created_at      timestamptz NOT NULL DEFAULT now(),
    retired_at      timestamptz,            -- no longer handed out for sealing (an erasure of the subject was sent)
    retired_by      text,                   -- that erasure's event_id
    destroyed_at    timestamptz,
    erasure_id      text,                   -- the subject.erased event that destroyed it
    CHECK ((destroyed_at IS NULL) = (wrapped IS NOT NULL))
);
-- the one key handed out for sealing; retired keys still open what they sealed until an erasure destroys them
CREATE UNIQUE INDEX IF NOT EXISTS data_keys_live ON data_keys (tenant, subject_digest)
    WHERE destroyed_at IS NULL AND retired_at IS NULL;
CREATE INDEX IF NOT EXISTS data_keys_subject ON data_keys (tenant, subject_digest);
CREATE INDEX IF NOT EXISTS data_keys_kek ON data_keys (kek_id) WHERE destroyed_at IS NULL;

-- one verifiable record per applied erasure: what was purged where, which keys died, which offsets they sealed.
-- No personal data: the subject is its tenant's keyed digest, the counts are numbers, the keys are ids and fingerprints.
CREATE TABLE IF NOT EXISTS erasures (
    tenant            text NOT NULL,
    erasure_id        text NOT NULL,        -- the subject.erased event's event_id
    subject_digest    text NOT NULL,
    requested_at      timestamptz NOT NULL, -- the erasure event's observed_at
    applied_at        timestamptz NOT NULL DEFAULT now(),
    topic             text NOT NULL,
    "partition"       integer NOT NULL,     -- the subject's partition (all its records are there)
    "offset"          bigint NOT NULL,      -- the erasure event's offset: the records covered lie before it
    first_offset      bigint,               -- the subject's earliest projected event (NULL: none was projected)
    records           integer NOT NULL,     -- events of the subject the projection purged
    sealed_records    integer NOT NULL,     -- of those, sealed (unreadable once their key is gone)
    clear_records     integer NOT NULL,     -- of those, clear text (published before encryption): still readable
    key_ids           text[] NOT NULL,
    key_fingerprints  text[] NOT NULL,
    purged            jsonb NOT NULL,       -- {"postgres": {"versions": n, "events": n, "accesses": n, "outbox": n}}
    search_documents  integer,              -- documents the indexer deleted (NULL until it has)
    search_purged_at  timestamptz,
    PRIMARY KEY (tenant, erasure_id)
);
CREATE INDEX IF NOT EXISTS erasures_subject ON erasures (tenant, subject_digest, applied_at);

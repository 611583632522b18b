"""Crypto-shredding: per-subject data keys, wrapped by a key-encryption key, and the sealed envelope.

- `kek`: the key-encryption keys (configuration, an interface a KMS can replace) that wrap data keys.
- `envelope`: which fields of an event are personal and how a record carries them sealed (pure functions).
- `store`: the key table and the erasure records in PostgreSQL (`Settings.keys_schema`, never rebuilt).
- `provider`: how a producer gets a subject's data key: from the store, or from the API (`POST /v1/keys`).
- `cli`: `ledger keys`, the operator's side of the key-encryption keys.

docs/encryption.md says what is encrypted, where keys live, what to back up and what erasure guarantees.
"""

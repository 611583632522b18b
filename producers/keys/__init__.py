"""Crypto-shredding: per-subject data keys, wrapped by a key-encryption key, and the sealed envelope.

- `kek`: the key-encryption keys (configuration, an interface a KMS can replace) that wrap data keys.
- `envelope`: which fields of an event are personal and how a record carries them sealed (pure functions).
- `store`: the key table and the erasure records in PostgreSQL (`Settings.keys_schema`, never rebuilt).
- `provider`: how a producer gets a subject's data key: from the store, or from the API (`POST /v1/keys`).
- `cli`: `ledger keys`, the operator's side of the key-encryption keys. `signing`: the ledger chain's signing key.

docs/encryption.md says what is encrypted, where keys live, what to back up and what erasure guarantees.
"""

import base64
import binascii


def key_bytes(text: str, what: str, need: str, error: type[Exception]) -> bytes:
    """The 32 raw bytes of a configured base64 key (a KEK, a trusted public key); `error` naming `what` otherwise,
    with `need` saying why 32."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise error(f"{what} is not valid base64") from None
    if len(raw) != 32:
        raise error(f"{what} is {len(raw)} bytes; {need}")
    return raw

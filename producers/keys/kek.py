"""Key-encryption keys (KEKs): configuration that wraps every data key, so the key table alone reveals nothing.

`LocalKeks` reads them from `Settings.kek` (an environment secret) or `Settings.kek_file`: either one base64
32-byte key (id "default") or JSON `{"active": "<id>", "keys": {"<id>": "<base64>", ...}}`. Several ids exist
during a rotation: new data keys are wrapped by the active one, `ledger keys rotate` rewraps the others, then the
old id can leave the configuration. A KMS replaces this class by implementing `KeyEncryption` (wrap/unwrap by id).

Wrapping is AES-256-GCM with a random 96-bit nonce and the data key's identity (key id, tenant, subject digest) as
associated data: a wrapped key copied onto another row does not unwrap. Every KEK leaves a check value in the key
store (`kek_checks`) the first time it is used, so a wrong key under a known id fails at start (`check_store`),
not silently per record.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from producers.keys import key_bytes

__all__ = ["KekError", "KeyEncryption", "LocalKeks", "CHECK_PLAINTEXT", "load_keks"]

CHECK_PLAINTEXT = b"memory-ledger key-encryption key check v1"
_NONCE = 12


class KekError(RuntimeError):
    """The key-encryption key configuration is missing, malformed, or not the key the store was wrapped with."""


class KeyEncryption(Protocol):
    """What the key store needs from a KEK provider (a file, an environment secret, a KMS)."""

    @property
    def active_id(self) -> str: ...

    def ids(self) -> frozenset[str]: ...

    def wrap(self, kek_id: str, plaintext: bytes, aad: bytes) -> bytes: ...

    def unwrap(self, kek_id: str, wrapped: bytes, aad: bytes) -> bytes: ...


@dataclass(frozen=True)
class LocalKeks:
    """KEKs held in this process's memory (from the environment or a file)."""

    active: str
    keys: dict[str, bytes]

    @property
    def active_id(self) -> str:
        return self.active

    def ids(self) -> frozenset[str]:
        return frozenset(self.keys)

    def _cipher(self, kek_id: str) -> AESGCM:
        key = self.keys.get(kek_id)
        if key is None:
            raise KekError(f"the key-encryption key {kek_id!r} is not configured (LEDGER_KEK / LEDGER_KEK_FILE)")
        return AESGCM(key)

    def wrap(self, kek_id: str, plaintext: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._cipher(kek_id).encrypt(nonce, plaintext, aad)

    def unwrap(self, kek_id: str, wrapped: bytes, aad: bytes) -> bytes:
        try:
            return self._cipher(kek_id).decrypt(wrapped[:_NONCE], wrapped[_NONCE:], aad)
        except InvalidTag:
            raise KekError(
                f"the key-encryption key {kek_id!r} does not open a value it is said to have wrapped"
            ) from None

    def __repr__(self) -> str:  # never the key bytes, in a log or a traceback
        return f"LocalKeks(active={self.active!r}, ids={sorted(self.keys)!r})"


def _key(kek_id: str, text: object) -> bytes:
    if not isinstance(text, str):
        raise KekError(f"the key-encryption key {kek_id!r} must be a base64 string")
    return key_bytes(text, f"the key-encryption key {kek_id!r}", "AES-256 needs 32", KekError)


def parse_keks(text: str, origin: str) -> LocalKeks:
    """KEKs from their configured text: one base64 key, or the JSON ring; KekError naming `origin` otherwise."""
    text = text.strip()
    if not text:
        raise KekError(f"{origin} is empty")
    if not text.startswith("{"):
        return LocalKeks("default", {"default": _key("default", text)})
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise KekError(f"{origin} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), dict) or not data["keys"]:
        raise KekError(f'{origin} must be {{"active": "<id>", "keys": {{"<id>": "<base64 32 bytes>"}}}}')
    keys = {str(k): _key(str(k), v) for k, v in data["keys"].items()}
    active = data.get("active")
    if active not in keys:
        raise KekError(f"{origin}: the active id {active!r} is not one of its keys {sorted(keys)}")
    return LocalKeks(active, keys)


def load_keks(kek: str | None, kek_file: Path | None) -> LocalKeks | None:
    """The configured KEKs, None if none is configured; KekError if what is configured is unusable."""
    if kek is not None and kek_file is not None:
        raise KekError("set one of LEDGER_KEK and LEDGER_KEK_FILE, not both")
    if kek is not None:
        return parse_keks(kek, "LEDGER_KEK")
    if kek_file is not None:
        try:
            text = Path(kek_file).read_text()
        except OSError as exc:
            raise KekError(f"LEDGER_KEK_FILE {str(kek_file)!r} cannot be read: {exc.strerror or exc}") from None
        return parse_keks(text, f"LEDGER_KEK_FILE {str(kek_file)!r}")
    return None


def new_kek() -> str:
    """A fresh base64 KEK (what `ledger keys new-kek` prints)."""
    return base64.b64encode(os.urandom(32)).decode()

"""The ledger chain's signing key (Ed25519): the worker signs checkpoints of the chain heads with it.

The private key lives in a file (`Settings.chain_key_file`, PEM PKCS#8, mode 0600; infra creates a local one for the
services it starts, as it does the KEK), never in PostgreSQL: whoever can write the database cannot sign. Each
checkpoint stores the public key it was signed with (and its id, a digest of it), so verifying needs no secret;
a verifier trusts the configured key's public half and `Settings.chain_trusted_keys`.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from producers.keys import key_bytes

__all__ = [
    "ChainSigner",
    "SigningKeyError",
    "key_id",
    "load_signer",
    "new_signing_key",
    "parse_public_key",
    "public_key_text",
    "signature_valid",
]


class SigningKeyError(RuntimeError):
    """The configured signing key cannot be read or is not an Ed25519 private key."""


def key_id(public: bytes) -> str:
    """A short stable name for a public key: the first 16 hex digits of its sha256."""
    return hashlib.sha256(public).hexdigest()[:16]


@dataclass(frozen=True)
class ChainSigner:
    """An Ed25519 private key in memory, with its raw 32-byte public key and id."""

    private: Ed25519PrivateKey
    public: bytes
    key_id: str

    @classmethod
    def of(cls, private: Ed25519PrivateKey) -> ChainSigner:
        public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return cls(private, public, key_id(public))

    @classmethod
    def of_pem(cls, pem: bytes, origin: str = "the chain signing key") -> ChainSigner:
        """The signer of a PEM (PKCS#8) Ed25519 private key; SigningKeyError naming `origin` otherwise."""
        try:
            private = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise SigningKeyError(f"{origin} is not a PEM private key: {exc}") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise SigningKeyError(f"{origin} is not an Ed25519 key")
        return cls.of(private)

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)

    def __repr__(self) -> str:  # never the key, in a log or a traceback
        return f"ChainSigner(key_id={self.key_id!r})"


def new_signing_key() -> bytes:
    """A fresh Ed25519 private key as PEM (PKCS#8, unencrypted): what infra writes to `<data_dir>/chain-key`."""
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_signer(path: Path | None) -> ChainSigner | None:
    """The signer of the key file at `path`; None when no file is configured; SigningKeyError when unusable."""
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"LEDGER_CHAIN_KEY_FILE {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    return ChainSigner.of_pem(data, f"LEDGER_CHAIN_KEY_FILE {str(path)!r}")


def public_key_text(public: bytes) -> str:
    """A public key as configured in `LEDGER_CHAIN_TRUSTED_KEYS`: base64 of its 32 raw bytes."""
    return base64.b64encode(public).decode()


def parse_public_key(text: str) -> bytes:
    """The raw 32 bytes of a base64 public key (`public_key_text`); SigningKeyError otherwise."""
    return key_bytes(text, f"the trusted chain key {text!r}", "an Ed25519 public key has 32", SigningKeyError)


def signature_valid(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether `signature` is `public`'s Ed25519 signature of `message` (False for a malformed key or signature)."""
    try:
        Ed25519PublicKey.from_public_bytes(bytes(public)).verify(bytes(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True

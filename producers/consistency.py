"""Consistency tokens: where a write landed on the ledger, as one opaque string a read can wait for.

A token is {partition: next offset} of the ledger topic after the write's records; a read given it answers once
the stored positions reach it. Only the canonical spelling (`v1.` + base64url of `p:o,...`) is accepted, so a
token compares and caches as text and nothing can be smuggled through it; positions are global offsets, so it says
nothing about any tenant's data. Pure: the SDK, the API and the read client use it.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping

__all__ = ["MAX_TOKEN_CHARS", "decode_token", "encode_token", "merge_tokens", "token_of"]

_PREFIX = "v1."
MAX_TOKEN_CHARS = 4096  # far beyond any topic's partitions; a bound on what a caller makes us parse
_MAX_PARTITION = 1 << 16
_MAX_OFFSET = (1 << 63) - 1
_ENTRY = re.compile(r"(0|[1-9][0-9]{0,18}):(0|[1-9][0-9]{0,18})")


def encode_token(positions: Mapping[int, int]) -> str:
    """The token of these next offsets (at least one partition)."""
    text = ",".join(f"{p}:{o}" for p, o in sorted(positions.items()))
    return _PREFIX + base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_token(text: str) -> dict[int, int]:
    """{partition: next_offset} of a token; ValueError (saying what is wrong, never echoing it) otherwise."""
    if not isinstance(text, str) or not text.startswith(_PREFIX) or len(text) > MAX_TOKEN_CHARS:
        raise ValueError("not a consistency token: pass the consistency_token a write answered, as it is")
    body = text[len(_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a consistency token: it does not decode") from None
    positions: dict[int, int] = {}
    for entry in raw.split(","):
        m = _ENTRY.fullmatch(entry)
        if m is None:
            raise ValueError("not a consistency token: its positions do not read as partition:offset")
        p, o = int(m[1]), int(m[2])
        if p >= _MAX_PARTITION or o > _MAX_OFFSET or p in positions:
            raise ValueError("not a consistency token: a partition or an offset out of range, or named twice")
        positions[p] = o
    if encode_token(positions) != text:
        raise ValueError("not a consistency token: not spelled as a write answers it")
    return positions


def token_of(written: Iterable[tuple[int, int]]) -> str | None:
    """The token of records at these (partition, offset) positions: the next offset of each partition's last."""
    positions: dict[int, int] = {}
    for p, o in written:
        positions[p] = max(positions.get(p, 0), o + 1)
    return encode_token(positions) if positions else None


def merge_tokens(*tokens: str | None) -> str | None:
    """One token waiting for all of these (the later position of each partition); None if none is given."""
    positions: dict[int, int] = {}
    for token in tokens:
        if token is None:
            continue
        for p, o in decode_token(token).items():
            positions[p] = max(positions.get(p, 0), o)
    return encode_token(positions) if positions else None

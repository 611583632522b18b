"""Consistency tokens: where a write landed on the ledger, as one opaque string a read can wait for.

A token is {partition: next offset} of the ledger topic after the write's records; a read given it answers once
the stored positions reach it. Only the canonical spelling (`v2.` + base64url of `p:o,...` + `.` + its CRC-32) is
accepted, so a token compares and caches as text and nothing can be smuggled through it. The check is there because
a token cut short (a column too narrow, a copy and paste) can still spell earlier positions, and a read would then
wait for less than the write. Tokens a version without the check answered (`v1.`) still read. Positions are global
offsets, so a token says nothing about any tenant's data. Pure: the SDK, the API and the read client use it.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from collections.abc import Iterable, Mapping

__all__ = ["MAX_TOKEN_CHARS", "decode_token", "encode_token", "merge_tokens", "token_of"]

_PREFIX = "v2."
_UNCHECKED_PREFIX = "v1."  # answered before tokens carried their check
MAX_TOKEN_CHARS = 4096  # far beyond any topic's partitions; a bound on what a caller makes us parse
_MAX_PARTITION = 1 << 16
_MAX_OFFSET = (1 << 63) - 1
_ENTRY = re.compile(r"(0|[1-9][0-9]{0,18}):(0|[1-9][0-9]{0,18})")


def _spelled(positions: Mapping[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(positions.items()))


def _body(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _check(raw: str) -> str:
    return f"{zlib.crc32(raw.encode()):08x}"


def encode_token(positions: Mapping[int, int]) -> str:
    """The token of these next offsets (at least one partition)."""
    raw = _spelled(positions)
    return f"{_PREFIX}{_body(raw)}.{_check(raw)}"


def decode_token(text: str) -> dict[int, int]:
    """{partition: next_offset} of a token; ValueError (saying what is wrong, never echoing it) otherwise."""
    if not isinstance(text, str) or not text.startswith((_PREFIX, _UNCHECKED_PREFIX)) or len(text) > MAX_TOKEN_CHARS:
        raise ValueError("not a consistency token: pass the consistency_token a write answered, as it is")
    checked = text.startswith(_PREFIX)
    body, dot, check = text[len(_PREFIX) :].partition(".")
    if checked != bool(dot):
        raise ValueError("not a consistency token: it was cut short or changed; pass it whole, as a write answered it")
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a consistency token: it does not decode") from None
    if checked and check != _check(raw):
        raise ValueError("not a consistency token: it was cut short or changed; pass it whole, as a write answered it")
    positions: dict[int, int] = {}
    for entry in raw.split(","):
        m = _ENTRY.fullmatch(entry)
        if m is None:
            raise ValueError("not a consistency token: its positions do not read as partition:offset")
        p, o = int(m[1]), int(m[2])
        if p >= _MAX_PARTITION or o > _MAX_OFFSET or p in positions:
            raise ValueError("not a consistency token: a partition or an offset out of range, or named twice")
        positions[p] = o
    if text != (encode_token(positions) if checked else _UNCHECKED_PREFIX + _body(_spelled(positions))):
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

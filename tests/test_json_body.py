"""The API's fast body parser reads every body as the standard parser does: the same value, of the same type,
or the same refusal (a class test over the places orjson and `json.loads` differ, plus random documents)."""

from __future__ import annotations

import json
import random

import pytest

from api.routes._json import parse_json_body

TRICKY = [
    b"10000000000000000000000000000",  # past 64 bits: orjson alone reads a float
    b"18446744073709551616",
    b"18446744073709551615",
    b"-9223372036854775809",
    b'{"n": -99999999999999999999, "s": "x"}',
    b"1e999",
    b"-1e999",
    b"NaN",
    b"[Infinity, -Infinity]",
    b'["\\ud800"]',  # a lone surrogate
    b'"a\\u0000b"',
    b"1.0000000000000000000001",
    b'{"a": 1, "a": 2}',  # a repeated key: the last one wins
    b"  [1, 2.5, true, null]  ",
    b'"\xc3\xa9"',
    b"",
    b"{",
    b"[1,]",
    b"\xff",
    b'{"events": [1]} trailing',
]


def _same(body: bytes) -> None:
    try:
        expected = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
        with pytest.raises(type(exc)):
            parse_json_body(body)
        return
    got = parse_json_body(body)
    assert repr(got) == repr(expected), body[:80]
    assert type(got) is type(expected), body[:80]


@pytest.mark.parametrize("body", TRICKY, ids=range(len(TRICKY)))
def test_each_body_where_the_parsers_differ_reads_as_the_standard_parser_reads_it(body: bytes) -> None:
    _same(body)


def _value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, 10 ** rng.randrange(1, 40)])
    if kind == 1:
        return rng.choice([0.1, -2.5e-308, 1e308, 123456789.123456789, float(rng.randrange(10**6)) / 7])
    if kind == 2:
        return "".join(
            chr(rng.choice([0x41, 0xE9, 0x4E2D, 0x1F600, 0x30, 0x22, 0x5C])) for _ in range(rng.randrange(6))
        )
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return "9" * rng.randrange(15, 25)  # long digit runs inside strings
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randrange(4))}


def test_random_documents_read_as_the_standard_parser_reads_them() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        _same(json.dumps(_value(rng)).encode())

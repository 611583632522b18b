"""The API's fast body parser reads every body as the standard parser does: the same value, of the same type,
or the same refusal (a class test over the places orjson and `json.loads` differ, plus random documents)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute

from api.main import create_app
from api.routes._json import OrjsonBodyRoute
from producers.contract import read_json
from producers.settings import Settings

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
    # long digit runs: integers where a number starts (after spaces, a minus sign), fractions, exponents, strings
    b"[ -12345678901234567890123]",
    b'{"n":\n\t-12345678901234567890}',
    b"[" + b" " * 100 + b"123456789012345678901]",  # more spaces than the scan looks back over
    b"[1e0000000000000000000005, 0.12345678901234567890123, 12345678901234567890.5]",
    b'{"digest": "ad449f7cd828749658489367506451ba5eb45187e4c8c3816e"}',  # a run inside a hex digest
    b'{"s": "x: 12345678901234567890123", "n": 123456789012345678901234}',
    b'{"s": "12345678901234567890123", "n": 1}',
    b'["' + b"1234567890123456789 " * 20_000 + b'", 99999999999999999999]',  # more runs in strings than are judged
]


def _same(body: bytes) -> None:
    try:
        expected = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
        with pytest.raises(type(exc)):
            read_json(body)
        return
    got = read_json(body)
    assert repr(got) == repr(expected), body[:80]
    assert type(got) is type(expected), body[:80]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-32-be"])
def test_a_body_not_in_utf8_is_refused_where_the_standard_parser_guesses_its_encoding(encoding: str) -> None:
    """JSON between systems is UTF-8 (RFC 8259), as every refusal here says; given bytes, `json.loads` also guesses
    UTF-16 and UTF-32, so the fallback to it accepted them (a door, and a worker reading a raw record)."""
    body = json.dumps({"events": [{"value": "café 😀"}]}, ensure_ascii=False).encode(encoding)
    assert json.loads(body)["events"][0]["value"] == "café 😀"  # the standard parser guesses
    with pytest.raises(ValueError):
        read_json(body)
    assert read_json(b"\xef\xbb\xbf" + body.decode(encoding).encode()) == json.loads(body)  # one UTF-8 BOM: read


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


@pytest.mark.parametrize(
    "layout", [{}, {"separators": (",", ":")}, {"indent": 2}], ids=["spaced", "compact", "indented"]
)
def test_random_documents_read_as_the_standard_parser_reads_them(layout: dict[str, object]) -> None:
    rng = random.Random(7)
    for _ in range(2000):
        _same(json.dumps(_value(rng), **layout).encode())  # type: ignore[arg-type]


def _api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        inner = getattr(route, "original_router", None)  # an included router (FastAPI includes them lazily)
        if inner is not None:
            yield from _api_routes(inner.routes)


def test_every_route_that_takes_a_body_parses_it_with_the_fast_parser(base_settings: Settings) -> None:
    """A class test: a new route with a body on a router without the route class would parse megabytes with the
    standard parser, on the event loop."""
    taking = {
        (sorted(r.methods)[0], r.path): type(r) for r in _api_routes(create_app(base_settings).routes) if r.body_field
    }
    assert ("POST", "/receipts/verify") in taking and ("POST", "/events") in taking, sorted(taking)
    assert {k: v for k, v in taking.items() if not issubclass(v, OrjsonBodyRoute)} == {}

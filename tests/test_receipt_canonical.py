"""The bytes receipts are signed over are RFC 8785 canonical JSON, so a client in another language rebuilds them
from the JSON it received: a JavaScript client re-serializing a receipt writes `400.0` as `400` and had every
untouched receipt fail verification. Checked against the rfc8785 library on generated documents."""

from __future__ import annotations

import hmac
import json
import random
import string
import struct

import pytest
import rfc8785

from api.receipts import canonical

pytestmark = pytest.mark.unit

UNICODE = string.ascii_letters + 'é中ｱ\uffff😀\U0001f600\u2028\x00\x1f"\\/\t'


def _float(r: random.Random) -> float:
    pick = r.random()
    if pick < 0.3:
        return float(r.randint(-(2**60), 2**60)) if r.random() < 0.2 else float(r.randint(-1000, 1000))
    if pick < 0.9:
        return r.choice([1, -1]) * 10 ** r.uniform(-12, 25)
    while True:  # any bit pattern that is a finite double
        x = struct.unpack("d", struct.pack("Q", r.getrandbits(64)))[0]
        if x == x and abs(x) != float("inf"):
            return x


def _text(r: random.Random) -> str:
    return "".join(r.choice(UNICODE) for _ in range(r.randint(0, 6)))


def _document(r: random.Random, depth: int = 0) -> object:
    pick = r.random()
    if depth < 3 and pick < 0.25:
        return {_text(r): _document(r, depth + 1) for _ in range(r.randint(0, 5))}
    if depth < 3 and pick < 0.4:
        return [_document(r, depth + 1) for _ in range(r.randint(0, 5))]
    if pick < 0.7:
        return _float(r)
    if pick < 0.8:
        return r.randint(-(2**53), 2**53)
    return r.choice([_text(r), True, False, None])


def test_receipts_are_signed_over_rfc8785_canonical_json():
    r = random.Random(8785)
    for _ in range(5000):
        doc = _document(r)
        assert canonical(doc) == rfc8785.dumps(doc), doc


def test_a_receipt_reserialized_by_javascript_gives_the_same_bytes():
    """JSON.parse then JSON.stringify: whole floats lose their `.0`; the canonical bytes must not change."""
    receipt = {"ranking": {"rerank_weight": 1.0, "rerank_budget_ms": 400.0, "time_preference": 0.6}, "n": [2.0, -0.0]}
    as_javascript_writes = json.loads(json.dumps(receipt).replace(".0,", ",").replace(".0}", "}").replace(".0]", "]"))
    assert as_javascript_writes["ranking"]["rerank_weight"] == 1 and type(as_javascript_writes["n"][0]) is int
    assert canonical(receipt) == canonical(as_javascript_writes)


def test_integers_javascript_cannot_hold_are_written_exactly():
    assert canonical({"value": 2**63 - 1, "tiny": 1e-7}) == b'{"tiny":1e-7,"value":9223372036854775807}'


def test_the_digests_taken_in_one_walk_are_the_canonical_ones():
    """A receipt's digests (`_digest_and_parts`: the answer made plain once, its parts hashed from that) and its
    cited events' HMACs (`_keyed_plain`: orjson's bytes) are those of `canonical`, for answers with and without
    values orjson does not write as RFC 8785 does (there the canonical path is taken)."""
    from api.receipts import _EVENT, _digest_and_parts, _keyed, _keyed_plain, answer_digest, answer_parts

    r = random.Random(53)
    for _ in range(500):
        hit = {"version_id": _text(r), "value": _document(r), "match": {"stage": r.choice(["exact", "keyword"])}}
        hit["match"]["scores"] = {"prior": _float(r), "access": _float(r), "overlap": 1.0}
        recall = {"hits": [hit, {**hit, "version_id": "v2"}], "cues": _document(r), "trace": {"ms": _float(r)}}
        facts = {"facts": [_document(r), {"value": 2.0}], "consistency": {"waited_ms": 1.0}, "tenant": _text(r)}
        for kind, body in (("recall", recall), ("facts", facts)):
            want = {"answer_digest": answer_digest(body), "parts": answer_parts(kind, body)}
            assert _digest_and_parts(kind, body) == want, body
        cited = [_text(r), _text(r), "f" * 64, r.randint(0, 2**31), r.randint(0, 2**62)]
        assert _keyed_plain(b"salt", _EVENT, cited) == _keyed(b"salt", _EVENT, cited)
        # each HMAC copies one keyed start per salt and tag: the same as keying anew, whatever came before
        salt = r.randbytes(r.choice([16, 32, 64, 65, 100]))
        assert _keyed(salt, _EVENT, cited) == hmac.digest(salt, _EVENT + canonical(cited), "sha256").hex()

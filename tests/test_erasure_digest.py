"""An erasure record proves an erasure to whoever knows the subject, and names it to nobody else.

Subjects are erased in two tenants, with encryption on and off. Then every place an erasure record is exposed (the
API's list and read routes, which the console's Erasures view shows as they are, and the key store's rows in
PostgreSQL: erasure records and destroyed data keys) is attacked offline with a dictionary of candidate subjects
hashed without a key (sha256, sha1, md5, blake2b, sha512 of the subject and of tenant/subject spellings, and the
contract's own unkeyed digest): nothing matches. The one who knows the subject finds its record by asking
`GET /v1/erasures?tenant=&subject=`, and the same subject erased in two tenants gets two unrelated digests.

The subject.erased event on the topic carries the subject id itself (it is the Kafka key), which
docs/encryption.md says: use opaque subject ids.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections.abc import Iterator

import orjson
import pytest
from psycopg import sql
from pydantic import SecretStr

from producers.contract import subject_digest_for
from tests.conftest import unique
from tests.support import asserted, pg, pipeline, wait_for

KEY = "digest-key"
TENANTS = ("acme", "globex")
ERASED = ["user:73519", "user:70042"]  # opaque-looking ids, as the docs advise: still a small space to search
KEPT = "user:71111"
CANDIDATES = [f"user:{n}" for n in range(70_000, 80_000)]  # the attacker's dictionary: every id of the shape
HEX = re.compile(rb"[0-9a-f]{16,}")


def _unkeyed(tenant: str, subject: str) -> Iterator[str]:
    """Every unkeyed digest an attacker would try for (tenant, subject), hex."""
    spellings = [subject, f"{tenant}|{subject}", f"{tenant}:{subject}", f"{tenant}/{subject}", f"{tenant}\n{subject}"]
    spellings.append(f"{tenant}{subject}")
    for text in spellings:
        data = text.encode()
        for algorithm in ("sha256", "sha1", "md5", "sha512", "blake2b", "sha3_256"):
            yield hashlib.new(algorithm, data).hexdigest()
    yield subject_digest_for(tenant, subject)  # the contract's own digest: sha256 of a JSON array, public code


def _exposed_tokens(blobs: list[bytes]) -> set[str]:
    return {m.decode() for blob in blobs for m in HEX.findall(blob)}


def _cracked(tokens: set[str]) -> set[tuple[str, str]]:
    """The (tenant, subject) pairs of the dictionary whose unkeyed digest (or a prefix of it) is among `tokens`."""
    by_prefix: dict[str, set[str]] = {}
    for token in tokens:  # a digest may be shown truncated: match any shown token against the digest's prefixes
        by_prefix.setdefault(token[:16], set()).add(token)
    found = set()
    for tenant in TENANTS:
        for subject in {*CANDIDATES, *ERASED, KEPT}:
            for digest in _unkeyed(tenant, subject):
                if any(digest.startswith(t) for t in by_prefix.get(digest[:16], ())):
                    found.add((tenant, subject))
    return found


def _store_rows(settings) -> list[bytes]:
    """Every row of every table of the key store (erasure records, data keys, digest keys), as JSON text."""
    with pg(settings) as conn:
        tables = [
            t
            for (t,) in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (settings.keys_schema,)
            ).fetchall()
        ]
        assert "erasures" in tables and "data_keys" in tables, tables
        blobs = []
        for table in tables:
            query = sql.SQL("SELECT row_to_json(r)::text FROM {} r").format(sql.Identifier(settings.keys_schema, table))
            blobs += [row[0].encode() for row in conn.execute(query).fetchall()]
        return blobs


@pytest.fixture(params=["on", "off"])
def world(request, base_settings):
    kek = SecretStr(base64.b64encode(os.urandom(32)).decode()) if request.param == "on" else None
    settings = base_settings.private(
        unique("dig"), encryption=request.param, kek=kek, api_keys={KEY: list(TENANTS), "other": ["initech"]}
    )
    seed = [
        asserted(s, "pref.seat", "window", i, tenant=t, content=f"{s} prefers window seats")
        for t in TENANTS
        for i, s in enumerate([*ERASED, KEPT])
    ]
    with pipeline(settings, seed=seed, app=True) as pipe:
        erasures = {}
        for tenant in TENANTS:
            for subject in ERASED:
                r = pipe.client.delete(f"/v1/subjects/{subject}", params={"tenant": tenant}, headers={"X-API-Key": KEY})
                assert r.status_code == 202, r.text
                erasures[(tenant, subject)] = r.json()["event_id"]
        pipe.settle()
        yield settings, pipe.client, erasures


def test_no_unkeyed_digest_of_an_erased_subject_is_exposed_and_the_subject_finds_its_record(world):
    settings, client, erasures = world
    headers = {"X-API-Key": KEY}

    def records_complete():
        out = {}
        for (tenant, _subject), erasure_id in erasures.items():
            r = client.get(f"/v1/erasures/{erasure_id}", params={"tenant": tenant}, headers=headers)
            if r.status_code != 200 or not r.json()["complete"]:  # the indexer found the record by its digest
                return None
            out[erasure_id] = r.json()
        return out

    records = wait_for(records_complete, 90, 0.3, "every erasure record to be complete")
    exposed = [orjson.dumps(rec) for rec in records.values()]
    for tenant in TENANTS:
        listed = client.get("/v1/erasures", params={"tenant": tenant}, headers=headers)
        assert listed.status_code == 200, listed.text
        whole = listed.json()
        assert len(whole["erasures"]) == len(ERASED) and whole["more"] is False and whole["next_cursor"] is None
        exposed.append(listed.content)
        # a page at a time by next_cursor: the whole list, in its order, each record once
        pages = [client.get("/v1/erasures", params={"tenant": tenant, "limit": 1}, headers=headers).json()]
        while pages[-1]["more"]:
            ask = {"tenant": tenant, "limit": 1, "cursor": pages[-1]["next_cursor"]}
            pages.append(client.get("/v1/erasures", params=ask, headers=headers).json())
            assert len(pages) <= len(ERASED), pages
        assert [e for page in pages for e in page["erasures"]] == whole["erasures"]
        exposed += [orjson.dumps(page) for page in pages]
        odd = [["2026-12-05T12:00:00Z", ["x"]], ["2026-12-05T12:00:00Z", {"x": 1}], [1, "x"], ["x", "y", "z"]]
        odd_cursors = [base64.urlsafe_b64encode(orjson.dumps(o)).decode().rstrip("=") for o in odd]
        for bad in ("x", "", "W10", "WyJ4IiwxXQ", pages[0]["next_cursor"] + "A", "bm90IGpzb24", *odd_cursors):
            r = client.get("/v1/erasures", params={"tenant": tenant, "cursor": bad}, headers=headers)
            assert r.status_code == 422 and r.json()["detail"][0]["field"] == "cursor", (bad, r.text)
    exposed += _store_rows(settings)
    assert not [b for b in exposed if any(s.encode() in b for s in (*ERASED, KEPT))]  # no subject in clear

    assert _cracked(_exposed_tokens(exposed)) == set()

    # whoever knows the subject finds its record (and only its own), in its own tenant only
    for (tenant, subject), erasure_id in erasures.items():
        found = client.get("/v1/erasures", params={"tenant": tenant, "subject": subject}, headers=headers).json()
        assert [e["erasure_id"] for e in found["erasures"]] == [erasure_id]
        assert found["erasures"][0]["subject_digest"] == records[erasure_id]["subject_digest"]
    for tenant in TENANTS:
        none = client.get("/v1/erasures", params={"tenant": tenant, "subject": KEPT}, headers=headers).json()
        assert none["erasures"] == []
    foreign = client.get(
        "/v1/erasures", params={"tenant": TENANTS[0], "subject": ERASED[0]}, headers={"X-API-Key": "other"}
    )
    assert foreign.status_code == 403, foreign.text
    # the same subject in two tenants: unrelated digests (one tenant's record tells nothing about the other's)
    for subject in ERASED:
        digests = {records[erasures[(t, subject)]]["subject_digest"] for t in TENANTS}
        assert len(digests) == len(TENANTS), digests

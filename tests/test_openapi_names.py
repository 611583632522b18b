"""The names a generated client takes from the OpenAPI spec read well: `client.recall(...)`, not
`recall_v1_recall_post(...)`, and no schema is named like a Python keyword (a generated model class must be
renamed then). Pure: the spec of `create_app`, no server asked, so every route, also one added later, is checked.
"""

from __future__ import annotations

import keyword
import re
from typing import Any

import pytest

from api.main import create_app
from producers.settings import Settings

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


@pytest.fixture(scope="module")
def spec(base_settings: Settings) -> dict[str, Any]:
    return create_app(base_settings).openapi()


def _operation_ids(spec: dict[str, Any]) -> list[str]:
    return [op["operationId"] for ops in spec["paths"].values() for m, op in ops.items() if m in METHODS]


def _python_keyword(name: str) -> bool:
    return keyword.iskeyword(name) or keyword.issoftkeyword(name)


def test_every_operation_id_is_a_plain_unique_python_name(spec: dict[str, Any]) -> None:
    ids = _operation_ids(spec)
    assert ids, "no operation in the spec"
    bad = [
        i
        for i in ids
        if not i.isidentifier() or _python_keyword(i) or "_v1_" in i or re.search(rf"_({'|'.join(METHODS)})$", i)
    ]
    assert bad == []
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_no_schema_is_named_like_a_python_keyword(spec: dict[str, Any]) -> None:
    names = list(spec.get("components", {}).get("schemas", {}))
    assert names and [n for n in names if not n.isidentifier() or _python_keyword(n)] == []

"""The `text` path convertor: a path parameter that takes `/` and line feeds, so a route reads every subject, event
id or erasure id the ledger stores, exactly.

Starlette's `path` convertor is `.*`, which stops at a line feed, and a route's pattern ends in `$`, which also
matches before a trailing one: `DELETE /v1/subjects/x%0A` matched the subject `x`. A `text` parameter takes any
character, greedily, so a line feed at the end of the path belongs to it; where a route's path ends in a literal
(`.../facts`), a line feed after it is refused before routing (api.request_guard).
"""

from __future__ import annotations

from starlette.convertors import PathConvertor, register_url_convertor


class TextConvertor(PathConvertor):
    regex = "(?s:.*)"


# registered when api.routes is imported, before any of its modules declares a route
register_url_convertor("text", TextConvertor())

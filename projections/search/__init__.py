"""The Elasticsearch projection (fact versions as search documents) and deterministic-first recall.

- `mapping`: index settings/mappings, physical indices behind the alias.
- `documents`: a fact_versions row -> its search document (and the SQL that reads rows).
- `cues`: pure cue rules (entities, keys through aliases, time words, event types), shared by write and read.
- `indexer`: drains `search_outbox` into the index (`drain_once`, `run_indexer`, `ledger indexer`).
- `reindex`: `ledger reindex` (new physical index + atomic alias switch) and the orphan check.
- `ids`: every document id of the index (or of a tenant, a subject), one scan.
- `vocab`: a tenant's cue vocabulary from PostgreSQL, cached.
- `recall`: the engine behind `POST /v1/recall`, a package of stages (see its docstring).
- `calibrate`: measures the semantic cut-offs on the configured model.
"""

"""The Elasticsearch projection (fact versions as search documents) and deterministic-first recall.

- `mapping`: index settings/mappings, physical indices behind the alias. `client`: clients that encode with orjson.
- `documents`: a fact_versions row -> its search document (and the SQL that reads rows).
- `cues`, `dates`, `stemming`: pure cue rules (entities, keys through aliases, time words, event types, calendar
  dates, English stems), shared by write and read. `modes`: the recall modes.
- `indexer`: drains `search_outbox` into the index (`ledger indexer`). `embedder`: the documents' vectors
  (`ledger embedder`). `vectors`: stored vectors. `duplicates`: near-duplicate episodes, linked.
- `claims`: the locks that let any number of indexers and embedders share the work. `drain`: their one loop.
  `metrics`: their metrics.
- `reindex`: `ledger reindex` (new physical index + atomic alias switch) and the orphan check. `cli`: the commands.
- `ids`: every document id of the index (or of a tenant, a subject), one scan.
- `vocab`: a tenant's cue vocabulary from PostgreSQL, kept up to date from the indexers' log.
- `recall`: the engine behind `POST /v1/recall`, a package of stages (see its docstring).
- `calibrate`: measures the semantic cut-offs on the configured model.
"""

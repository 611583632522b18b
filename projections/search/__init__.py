"""The Elasticsearch projection (fact versions as search documents) and deterministic-first recall.

Modules: `mapping`, `client`, `documents` (row -> document), the pure cue rules `cues`, `dates`, `stemming`,
`modes`; the workers `indexer`, `embedder`, `vectors`, `duplicates`, `claims` (their locks), `drain` (their loop),
`metrics`; `reindex` and `cli` (the commands), `ids`, `vocab` (a tenant's cue vocabulary), `recall` (the engine of
`POST /v1/recall`) and `calibrate` (measures the semantic cut-offs).
"""

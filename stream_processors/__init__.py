"""The projector worker (faust): the ledger and the access topic into PostgreSQL, and `ledger rebuild`.

- `app`, `worker`, `__main__`, `cli`: the faust app, running it (`ledger worker`), and `ledger rebuild`'s command.
- `agents`: ledger records -> the recorder; `access`: access records -> the access projector; `dlq`: dead letters.
- `rebuild`: replay the topics into a fresh schema, then switch. `verify`: `ledger verify`. `metrics`: the worker's
  metrics.

Elasticsearch is fed from PostgreSQL's outbox by projections.search (`ledger indexer`, `ledger embedder`).
"""

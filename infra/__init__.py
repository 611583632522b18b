"""Installs, starts, stops and reports on memory-ledger's own stack (see `python -m infra --help`).

- `stack`, `__main__`: the parts in dependency order, and the command line. `procs`: pid files and health waits.
- `cli`: `ledger`, the operator's command line: it registers every layer's commands (each lives beside the
  code it drives), so it sits here, outside the layers.
- `kafka`, `elasticsearch`, `postgres`, `maven`: the servers and where they come from. `kafka_cluster`,
  `es_cluster`, `pg_server` (sharing `local_cluster`): clusters and a TLS server of their own, for tests.
- `model`, `reranker`: the embedding models and the cross-encoder. `service`: the ledger's own processes.
- `procs.launch` / `terminate` and `private.drop_private`: the one launcher and the one clean-up of a private run,
  shared with the benchmarks and the tests.
"""

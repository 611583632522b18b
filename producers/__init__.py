"""The bottom layer: what every process shares (settings, logs, metrics) and the write path to the ledger.

- `settings`: the one settings class (LEDGER_* variables). `logs`, `metrics`: logging and Prometheus for all.
- `contract`, `event_schema`, `records`: the event contract, as Python and as JSON Schema; a record as read.
- `sdk`, `kafka_producer`, `topics`, `cli`: the producer SDK, how every Kafka client connects, the ledger's
  topics, `ledger publish | topics | schema`. `retry`: the one bounded retry.
- `consistency`: consistency tokens, where a write landed on the ledger, for a read to wait for.
- `keys`: crypto-shredding (data keys, the key-encryption keys, the sealed envelope).
"""

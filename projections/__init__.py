"""Read models built from the ledger: PostgreSQL (versions, audit log) and Elasticsearch (recall)."""

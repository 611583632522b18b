"""faust-streaming workers that project the ledger into PostgreSQL and Elasticsearch."""

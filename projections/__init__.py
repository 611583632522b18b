"""Read models built from the ledger: PostgreSQL (versions, audit log) and Elasticsearch (recall).

- `versions`: the pure fold of events into version rows. `postgres`: the PostgreSQL projection and its reads.
- `search`: the Elasticsearch projection and recall.
- `models`, `embedding`, `languages`: the embedding models, loading them, and which one embeds a text.
- `reranker`: recall's cross-encoder. `shapes`: the shape of every JSON object the API answers.
"""

"""One settings class for every process: addresses, ports, paths, model name.

Everything is read from environment variables with the prefix ``LEDGER_`` (or a
``.env`` file), so the same code runs against the servers ``infra`` starts and
against external clusters. Nothing else in the project reads ``os.environ``.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, DotEnvSettingsSource, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent
PARTS = ("kafka", "elasticsearch", "postgres", "model")
DEV_API_KEY = "dev-key"  # works only with LEDGER_DEVELOPMENT=1
DEV_PG_PASSWORD = "ledger"  # the password infra gives the local role; refused elsewhere
_PG_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")  # a schema name that needs no quoting anywhere
_KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_ES_INDEX = re.compile(r"^[a-z0-9][a-z0-9._-]{0,254}$")


# a duration or a bound on a wait, in seconds: above 0 and finite (0 would spin a loop or time out at once, and
# `inf` or `nan` never end one)
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# a bound on a broker wait: kafka-python refuses a request timeout past a connection's idle limit (540 s)
BrokerSeconds = Annotated[float, Field(gt=0, le=300, allow_inf_nan=False)]
Port = Annotated[int, Field(ge=0, le=65535)]  # 0: the system picks one (a metrics port: none is served)
# one bootstrap server: a host or [IPv6 address], then :port (no SCHEME://: kafka-python drops one, but the worker's
# faust reads `kafka://SSL://host:9093` as a host named "ssl")
_BROKER = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\s:,\[\]/]+)):(?P<port>[0-9]{1,5})$")


def broker_address(server: str) -> tuple[str, int] | None:
    """(host, port) of one bootstrap server as LEDGER_KAFKA_BOOTSTRAP lists it, else None."""
    found = _BROKER.match(server.strip())
    if found is None or not 0 < int(found["port"]) <= 65535:
        return None
    return found["v6"] or found["host"], int(found["port"])


class UnsafeSettings(ValueError):
    """A setting that must not reach a deployment (a development secret) or an unsafe name."""


_DERIVED = {"LEDGER_DLQ_TOPIC": "its dead-letter topic", "LEDGER_ACCESS_TOPIC": "its access topic"}


def check_names(s: Settings, topics_from: str | None = None) -> None:
    """Names that end up in SQL, topic and index names: checked, never trusted (also for private copies).
    `topics_from`: what set the three topic names instead of their variables (a CLI option), for the error to name."""
    if not _PG_IDENTIFIER.match(s.pg_schema):
        raise UnsafeSettings(f"LEDGER_PG_SCHEMA {s.pg_schema!r}: lower-case letters, digits and _ (at most 63)")
    topics = (("LEDGER_TOPIC", s.topic), ("LEDGER_DLQ_TOPIC", s.dlq_topic), ("LEDGER_ACCESS_TOPIC", s.access_topic))
    for var, topic in topics:
        if not _KAFKA_TOPIC.match(topic) or topic in (".", ".."):
            named = var if topics_from is None else _DERIVED.get(var, topics_from)
            raise UnsafeSettings(f"{named} {topic!r}: letters, digits, '.', '_' and '-' (at most 249)")
    if s.access_topic in (s.topic, s.dlq_topic):  # accesses are never written to the ledger (or its DLQ)
        raise UnsafeSettings(f"LEDGER_ACCESS_TOPIC {s.access_topic!r} must differ from the ledger and DLQ topics")
    if s.key_schema and not _PG_IDENTIFIER.match(s.key_schema):
        raise UnsafeSettings(f"LEDGER_KEY_SCHEMA {s.key_schema!r}: lower-case letters, digits and _ (at most 63)")
    if len(s.keys_schema) > 63:
        raise UnsafeSettings(f"the key schema {s.keys_schema!r} is longer than 63 characters: set LEDGER_KEY_SCHEMA")
    if not _ES_INDEX.match(s.es_index):
        raise UnsafeSettings(f"LEDGER_ES_INDEX {s.es_index!r}: lower-case letters, digits, '.', '_' and '-'")


class InstallSettings(BaseModel):
    """What `infra` installs and starts, and where: versions, heaps, JDKs, data folders, how many of each
    service (read by infra; a deployment on managed servers leaves them alone)."""

    # where infra keeps data (git-ignored) and downloads (outside the repo)
    data_dir: Path = REPO_ROOT / ".data"
    cache_dir: Path = Path.home() / ".cache" / "memory-ledger"
    # parts that `infra up` installs and starts; the others are external and only health-checked
    managed: list[str] = Field(default_factory=lambda: list(PARTS))
    kafka_controller_port: Port = 9093
    kafka_version: str = "4.1.1"
    kafka_heap: str = "1g"
    java_home: Path | None = None  # Java 17+ for Kafka; None: `java` on PATH
    es_version: str = "9.5.2"
    es_heap: str = "2g"
    es_java_home: Path | None = None  # Java 21+ for ES 9; None: newest JDK in /usr/lib/jvm
    es_user: str = "ledger-es"
    # the local Elasticsearch's CPU priority (its session's autogroup too: infra.procs.launch): on a host shared
    # with the projection, PostgreSQL and the worker get the cores first, the documents next, the embedder's
    # vectors (embedder_nice) last; 0 on a host of its own
    es_nice: int = Field(default=5, ge=0, le=19)
    pg_bin_dir: Path | None = None  # None: newest /usr/lib/postgresql/*/bin
    embed_model_dir: Path | None = None  # None: <data_dir>/models/<model slug>
    rerank_model_dir: Path | None = None  # None: <data_dir>/models/<rerank model slug>
    indexers: int = 1
    embedders: int = 1


class KafkaSettings(BaseModel):
    """The ledger on Kafka: where it is, its topics."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    topic: str = "memory.events"
    dlq_topic: str = "memory.events.dlq"
    topic_partitions: int = 6
    topic_replication: int = 1
    # what recall and context serve, on its own topic (never the ledger's): recorded off the request path (api.access)
    access_topic: str = "memory.access"
    # how every client reaches the brokers (producers.kafka_producer.kafka_connection): TLS with SSL and
    # SASL_SSL (the system's CAs when kafka_ssl_cafile is unset), a password with SASL_*: masked, never logged
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None

    @model_validator(mode="after")
    def _kafka_bootstrap(self) -> KafkaSettings:
        for server in self.kafka_bootstrap.split(","):
            if broker_address(server) is None:
                raise ValueError(
                    f"LEDGER_KAFKA_BOOTSTRAP: {server.strip()!r} is not host:port (a comma-separated list of them)"
                )
        return self

    @model_validator(mode="after")
    def _kafka_security(self) -> KafkaSettings:
        sasl = self.kafka_security_protocol.startswith("SASL_")
        if sasl and (not self.kafka_sasl_username or self.kafka_sasl_password is None):
            raise ValueError(
                f"LEDGER_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} needs LEDGER_KAFKA_SASL_USERNAME and "
                "LEDGER_KAFKA_SASL_PASSWORD"
            )
        if not sasl and (self.kafka_sasl_username or self.kafka_sasl_password is not None):
            raise ValueError(
                "LEDGER_KAFKA_SASL_USERNAME / LEDGER_KAFKA_SASL_PASSWORD are set but "
                f"LEDGER_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} sends no credentials: use SASL_SSL "
                "(or SASL_PLAINTEXT)"
            )
        secret = self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password is not None else ""
        if "\x00" in (self.kafka_sasl_username or "") + secret:  # PLAIN's separator: the login would be another one
            raise ValueError("LEDGER_KAFKA_SASL_USERNAME / LEDGER_KAFKA_SASL_PASSWORD hold a NUL character")
        tls_files = (self.kafka_ssl_cafile, self.kafka_ssl_certfile, self.kafka_ssl_keyfile)
        if not self.kafka_security_protocol.endswith("SSL") and any(f is not None for f in tls_files):
            raise ValueError(
                f"LEDGER_KAFKA_SSL_* files are set but LEDGER_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} "
                "does not use TLS: use SSL or SASL_SSL"
            )
        if self.kafka_ssl_keyfile is not None and self.kafka_ssl_certfile is None:
            raise ValueError("LEDGER_KAFKA_SSL_KEYFILE needs LEDGER_KAFKA_SSL_CERTFILE (the client certificate)")
        return self


class PostgresSettings(BaseModel):
    """The projection in PostgreSQL: where it is, its schema, the pools that reach it."""

    pg_dsn: str = "postgresql://ledger:ledger@127.0.0.1:5433/ledger"
    pg_schema: str = "ledger"  # the projection's tables live in this schema
    pg_pool_size: int = 10
    pg_pool_timeout_s: Seconds = 3.0  # the API's longest wait for a pooled connection: then 503 naming postgres
    # libpq's connect_timeout, whole seconds: below 2 libpq waits 2 all the same, so a smaller one is refused
    pg_connect_timeout_s: int = Field(default=3, ge=2, le=300)
    pg_door_check_timeout_s: Seconds = 1.0  # POST /v1/events' idempotency lookup; skipped (not blocking) past it

    @model_validator(mode="after")
    def _pg_dsn_reads(self) -> PostgresSettings:
        """A DSN libpq cannot read is refused when the settings load (never quoted: it may hold a password), not
        at the first connection, where it was a ProgrammingError naming no setting."""
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(self.pg_dsn)
        except psycopg.ProgrammingError:
            raise ValueError(
                "LEDGER_PG_DSN is not a PostgreSQL connection string: write postgresql://user:password@host:5432/db "
                "(or libpq's key=value pairs)"
            ) from None
        return self


class ElasticsearchSettings(BaseModel):
    """The search index: where it is, its alias, the bound on one request."""

    # one node's URL, or a cluster's nodes' URLs separated by commas: every client then spreads its requests over
    # them and sends a request again to another node when one is unreachable (`es_urls`)
    es_url: str = "http://127.0.0.1:9200"
    es_index: str = "memory-facts"  # the alias; physical indices get a suffix
    es_request_timeout_s: Seconds = 10.0  # the API's bound on one Elasticsearch request
    # copies of each shard beside its primary, in the indices the indexer and `ledger reindex` create (1 on a
    # cluster: a node can stop and every document is still searchable); an existing index keeps its own
    es_replicas: int = Field(default=0, ge=0)
    # TLS of https:// nodes (projections.search.client.es_client): a private CA's PEM (unset: the system's CAs), a
    # client certificate where the cluster asks for one. A user and password ride in LEDGER_ES_URL
    es_ca_certs: Path | None = None
    es_client_cert: Path | None = None
    es_client_key: Path | None = None

    @model_validator(mode="after")
    def _es_tls(self) -> ElasticsearchSettings:
        tls_files = (self.es_ca_certs, self.es_client_cert, self.es_client_key)
        if any(f is not None for f in tls_files) and not all(u.startswith("https://") for u in self.es_urls):
            raise ValueError(
                "LEDGER_ES_CA_CERTS / LEDGER_ES_CLIENT_CERT / LEDGER_ES_CLIENT_KEY are set but a node of LEDGER_ES_URL "
                "is not https://: TLS files need every node on https"
            )
        if self.es_client_key is not None and self.es_client_cert is None:
            raise ValueError("LEDGER_ES_CLIENT_KEY needs LEDGER_ES_CLIENT_CERT (the client certificate)")
        return self

    @property
    def es_urls(self) -> list[str]:
        """The node URLs of `es_url`."""
        return [u.strip() for u in self.es_url.split(",") if u.strip()] or [self.es_url]

    @property
    def es_address(self) -> str:
        """`es_url` without any node's user and password: what a message or a status shows."""
        nodes = (urlsplit(u) for u in self.es_urls)
        return ",".join(p._replace(netloc=p.netloc.rpartition("@")[2]).geturl() for p in nodes)


class EmbeddingSettings(BaseModel):
    """The embedding models (fastembed, loaded from disk) and how texts are batched through them."""

    # the int8 zh model: the fastest candidate at equal quality (BENCHMARKS.md, "Embedding stage: candidates");
    # each text is embedded alone (projections.embedding), so there is no batch to size
    embed_model: str = "BAAI/bge-small-zh-v1.5-int8"
    # Latin-script text by embed_model_en, the rest by embed_model (projections.languages); switching either is a
    # `ledger reindex`. embed_threads: per model (0: one per core), 1 as more only spin on a shared host
    # (BENCHMARKS.md). embed_cross_language: English text also gets the default model's vector, so a Chinese question
    # reaches it. semantic_offset_en: moves recall's semantic cut-offs for English cosines (None: the model's own).
    embed_model_en: str = "BAAI/bge-small-en-v1.5-int8"
    embed_threads: int = 1
    embed_cross_language: bool = True
    semantic_offset_en: float | None = None


class WorkerSettings(BaseModel):
    """The projector (`ledger worker`) and the search stages (`ledger indexer`, `ledger embedder`)."""

    processor_group: str = "memory-ledger-projector"
    processor_batch_size: int = Field(default=500, ge=1)
    indexer_batch_size: int = Field(default=500, ge=1)  # outbox rows per batch
    indexer_rewrite_batch_size: int = Field(default=100, ge=1)  # rows per batch of vector rewrites (indexer.py)
    # the longest wait for work: a NOTIFY of the commit that gave it wakes a worker at once (projections.search.drain)
    indexer_poll_s: Seconds = 2.0
    indexer_max_backoff_s: Seconds = 4.0  # longest wait between retries while Elasticsearch or PostgreSQL is away
    # the embedding stage (`ledger embedder`, projections.search.embedder): any number of embedders claim versions
    # lacking vectors from embed_queue
    embedder_batch_size: int = Field(default=64, ge=1)  # versions per claim (one embedding call per model)
    embedder_poll_s: Seconds = 2.0  # the longest wait for work, as indexer_poll_s
    # the embedder's CPU priority (projections.search.drain.lower_priority): on a shared host the projection and
    # the documents get the cores first, the vectors what is left; 0 on a host of its own
    embedder_nice: int = Field(default=10, ge=0, le=19)


class ProducerSettings(BaseModel):
    """Publishing: the SDK's broker waits and the contract's clock window."""

    # bound on connecting, metadata and delivery (retries included)
    producer_timeout_s: BrokerSeconds = 30.0
    # an event observed further than this into the future is refused (`clock_skew`): it would win
    # over every later update until that time; the worker applies the same window to the broker time
    max_future_skew_s: float = 300.0


class AccessSettings(BaseModel):
    """Access tracking: what recall and context served, on a topic of its own."""

    access_recording: bool = True  # False: the API records no accesses (the bench's baseline)
    access_queue_size: int = 10_000  # servings waiting for the background flush; beyond it they are dropped (counted)
    access_flush_s: Seconds = 0.2  # how often the API's flush thread hands queued accesses to the producer
    # access records per flush of the API, and per projector transaction
    access_batch_size: int = Field(default=500, ge=1)


class RecallSettings(BaseModel):
    """Recall's stages: the keyword clause, the candidate pool, the rerank, the preferences."""

    # recall's prior: the access signal's weight in a hit's score (projections.search.recall.scoring); 0: it only
    # breaks ties, as any weight tried cost MRR on the dev set (bench/results/access-*.md)
    access_prior_weight: float = Field(default=0.0, ge=0.0, le=0.1)
    # recall's keyword stage: the minimum_should_match of its English-stem clause, in Elasticsearch's
    # syntax; "1<25%" = any one stem of up to 7, a quarter of longer questions (projections.search.recall.index)
    keyword_stem_min_match: str = Field(default="1<25%", pattern=r"^(\d+<)?-?\d+%?$")
    # recall's candidate pool: each fuzzy stage (keyword, semantic) lists this many before their lists are fused, so
    # what the rerank stage sees is not cut to top_k first (projections.search.recall.stages)
    recall_pool: int = Field(default=100, ge=10, le=200)
    # recall's rerank stage (projections.search.recall.rerank): an offline cross-encoder reorders the first
    # `rerank_candidates` fuzzy hits under a deadline of `rerank_budget_ms`, so an answer is never late
    rerank_enabled: bool = True
    rerank_model: str = "Xenova/ms-marco-MiniLM-L-12-v2"
    # 20 of a 100-deep pool, pairs cut to 128 tokens: chosen on the quality/latency curve (BENCHMARKS.md, "Dev set:
    # the candidate pool and the rerank curve"); scored head first, so a busy host still reranks the pool's head
    rerank_candidates: int = Field(default=20, ge=1, le=200)
    rerank_budget_ms: float = Field(default=400.0, gt=0)
    # 1: each pair alone, so its score does not depend on the pairs beside it (the int8 model quantizes a batch
    # together) and no padding is computed; larger batches cost more CPU here, not less (recall.rerank)
    rerank_batch_size: int = Field(default=1, ge=1, le=64)
    # threads scoring pairs at once, each pair on one core (the stage's own threads; onnxruntime runs on them)
    rerank_threads: int = Field(default=2, ge=1, le=16)
    rerank_weight: float = Field(default=1.0, ge=0.0, le=1.0)  # the CE's share of the order (1: by CE score alone)
    rerank_max_tokens: int = Field(default=128, ge=16, le=512)  # a (question, text) pair is truncated to this
    # recall's subject preference (projections.search.recall.prefer): an episode about none of the subjects
    # a question names (found by the fuzzy stages' second search) keeps this share of its strength (1: no preference)
    subject_preference: float = Field(default=0.4, ge=0.0, le=1.0)
    # recall's date preference (recall.prefer.time_preference): an episode or event off every calendar date
    # a question names ("in June", "on 13 October 2023") keeps this share of its strength (1: no preference)
    time_preference: float = Field(default=0.6, ge=0.0, le=1.0)
    # recall's context turns (projections.search.recall.neighbours): the turns around an episode hit, when a
    # recall asks for them, are those of its tenant and source.service observed within this many seconds of it
    recall_context_window_s: float = Field(default=1800.0, gt=0, le=7 * 86400, allow_inf_nan=False)


class ApiSettings(BaseModel):
    """The HTTP API and the MCP server: keys, addresses, bounds on their waits."""

    # API: key -> tenants it may read and write, e.g. {"dev-key": ["acme"]}
    api_keys: dict[str, list[str]] = Field(default_factory=lambda: {"dev-key": ["demo", "acme", "globex"]})
    api_host: str = "127.0.0.1"
    api_port: Port = 8000
    # the API's bound on a broker wait (connect, delivery): then 503 naming kafka
    api_kafka_timeout_s: BrokerSeconds = 5.0
    # the largest request body the API reads (api.request_guard): past it 413 `too_large`, before the key is checked
    api_max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # the MCP server (`ledger mcp`, api.mcp): where its Streamable HTTP transport binds (callers send
    # an API key of api_keys as a bearer token); a stdio server acts with mcp_api_key (or `--api-key`)
    mcp_host: str = "127.0.0.1"
    mcp_port: Port = 8001
    mcp_api_key: str | None = None
    # the keys of api_keys that get the MCP server's operator tools (the dead-letter workflow), so an agent's key is
    # refused them (403 `forbidden`) even for its own tenants; the HTTP routes take any key of the tenant
    mcp_admin_keys: list[str] = Field(default_factory=list)
    # receipts (api.receipts): every read (recall, context, facts, history, the audit replay) answers a signed
    # receipt of what it reflects; false: none (POST /v1/receipts/verify and /replay still check earlier ones)
    receipts: bool = True
    # a process's own calls to the API (a producer's data keys from key_endpoint): the bound on each phase of one
    # request (connect, write, read, pool wait). The read client has its settings apart (ClientSettings)
    client_timeout_s: Seconds = 10.0


class MetricsSettings(BaseModel):
    """Prometheus exporters (docs/metrics.md)."""

    # Prometheus metrics (docs/metrics.md): the API serves them on its own app at a path, without an API
    # key (no label holds tenant data); the worker and the indexer each on a port of their own (0: no exporter)
    api_metrics_path: str = "/metrics"  # "": the API serves no metrics
    worker_metrics_port: Port = 9101  # several workers on one host: one port each
    indexer_metrics_port: Port = 9102  # several indexers on one host: one port each
    embedder_metrics_port: Port = 9120  # infra gives its k-th embedder (and indexer) this port + k - 1
    metrics_host: str = "127.0.0.1"  # where the worker's and the indexer's exporters bind
    metrics_refresh_s: Seconds = 5.0  # how often gauges that need a query are refreshed (outbox depth, consumer lag)


class EncryptionSettings(BaseModel):
    """Sealing personal fields: the mode, the KEKs, the key store, how producers get data keys."""

    # personal fields sealed with a data key per (tenant, subject), wrapped by the KEK (docs/encryption.md). off:
    # clear records (sealed ones still read); on: producers seal; required: the worker also dead-letters a clear
    # record with personal fields (`not_encrypted`). off outside development warns at start (unsealed_warning)
    encryption: Literal["off", "on", "required"] = "off"
    # the KEKs: a base64 32-byte key (its id is "default"), or JSON {"active": "<id>", "keys": {"<id>": "<base64>"}}
    # (several ids during a rotation); kek_file: a file holding the same. Never logged; as_env passes it to children
    kek: SecretStr | None = None
    kek_file: Path | None = None
    key_schema: str = ""  # "": <pg_schema>_keys (never touched by `ledger rebuild`: the keys are not a projection)
    # producers without PostgreSQL credentials get their data keys from the API (POST /v1/keys) with an API key
    key_endpoint: str | None = None  # the API's base URL, e.g. http://127.0.0.1:8000; None: the key store directly
    key_api_key: str | None = None
    key_cache_ttl_s: Seconds = 30.0  # how long a producer reuses a subject's data key before asking again
    key_cache_size: int = 10_000  # subjects whose data key a producer keeps in memory


class ChainSettings(BaseModel):
    """The ledger chain and its signed checkpoints."""

    # the ledger chain (projections.postgres.chain): checkpoints of its heads are signed with chain_key_file's Ed25519
    # key (PEM, never in the database; None: heads only) every chain_checkpoint_records records or chain_checkpoint_s
    # seconds per partition. chain_trusted_keys: public keys (base64) `ledger verify` accepts besides the key's own
    chain_key_file: Path | None = None
    chain_checkpoint_records: int = Field(default=1000, ge=1)
    chain_checkpoint_s: Seconds = 60.0
    chain_trusted_keys: list[str] = Field(default_factory=list)


class LogSettings(BaseModel):
    """Logs: text or JSON lines, and the level."""

    # logs (producers.logs): every process writes the same lines to stderr, text or one JSON object per
    # line, with the ids of what it is doing (request_id, event_id, tenant, batch_id, partition, offset)
    log_format: Literal["text", "json"] = "text"
    log_level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(lambda v: str(v).upper())
    ] = "INFO"


class Settings(
    BaseSettings,
    LogSettings,
    ChainSettings,
    EncryptionSettings,
    MetricsSettings,
    ApiSettings,
    RecallSettings,
    AccessSettings,
    ProducerSettings,
    WorkerSettings,
    EmbeddingSettings,
    ElasticsearchSettings,
    PostgresSettings,
    KafkaSettings,
    InstallSettings,
):
    """Configuration of the whole stack, one group per component (the classes above); defaults run everything on
    loopback. One object, so each process reads the same LEDGER_* names and `as_env` hands a child all of them."""

    # hide_input_in_errors: a refusal's text never quotes what was read (a DSN's or Kafka's password, the KEK)
    model_config = SettingsConfigDict(env_prefix="LEDGER_", env_file=".env", extra="ignore", hide_input_in_errors=True)

    # development mode allows the development API key and the local default PostgreSQL password;
    # `make demo` / `make test` set it, a deployment never does
    development: bool = False

    @model_validator(mode="after")
    def _safe(self) -> Settings:
        check_names(self)
        if not self.development:
            self._refuse_development_secrets(api_keys=True, postgres=True)
        return self

    def _refuse_development_secrets(self, *, api_keys: bool, postgres: bool) -> None:
        if api_keys and DEV_API_KEY in self.api_keys:
            raise UnsafeSettings(
                f"LEDGER_API_KEYS holds the development key {DEV_API_KEY!r}: set your own keys, "
                "or LEDGER_DEVELOPMENT=1 on a development machine"
            )
        if postgres and urlsplit(self.pg_dsn).password == DEV_PG_PASSWORD:
            raise UnsafeSettings(
                "LEDGER_PG_DSN uses the local default password: set the real one, "
                "or LEDGER_DEVELOPMENT=1 on a development machine"
            )

    def private(self, name: str, **update: object) -> Settings:
        """A copy whose topic, DLQ, consumer group, schema and index are all named after `name`.

        Tests and benchmarks use it to get data of their own on shared servers.
        """
        names = {
            "topic": f"{name}.events",
            "dlq_topic": f"{name}.events.dlq",
            "access_topic": f"{name}.access",
            "processor_group": f"{name}-projector",
            "pg_schema": name,
            "es_index": f"{name}-facts",
            "key_schema": "",  # <name>_keys: a private key store too
            # private copies share a host with others: their exporters stay off unless asked for a port
            "worker_metrics_port": 0,
            "indexer_metrics_port": 0,
            "embedder_metrics_port": 0,
        }
        copy = self.model_copy(update={**names, **update})
        check_names(copy)  # model_copy does not validate
        return copy

    def as_env(self, **extra: object) -> dict[str, str]:
        """The LEDGER_* variables that make a child process read exactly these settings.

        Every field is written (JSON for lists and mappings), so a private copy (`private()`,
        `model_copy`) reaches the child whole; `extra` overrides fields by name. A field that is
        None is left out: start the child from `child_environ()`, which drops inherited LEDGER_*.
        """
        env: dict[str, str] = {}
        dumped = self.model_dump(mode="json")
        for name in dumped:  # model_dump masks a secret (the KEK, Kafka's password): a child needs the secret itself
            secret = getattr(self, name)
            if isinstance(secret, SecretStr):
                dumped[name] = secret.get_secret_value()
        for name, value in {**dumped, **extra}.items():
            if value is None:
                continue
            if isinstance(value, SecretStr):
                text = value.get_secret_value()
            elif isinstance(value, str):
                text = value
            elif isinstance(value, (dict, list, bool)):
                text = json.dumps(value)
            else:
                text = str(value)
            env[f"LEDGER_{name.upper()}"] = text
        return env

    def child_environ(self, **extra: object) -> dict[str, str]:
        """The whole environment of a child process: ours without any LEDGER_* variable, plus `as_env(**extra)`."""
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
        return {**inherited, **self.as_env(**extra)}

    @property
    def kafka_host_port(self) -> tuple[str, int]:
        first = broker_address(self.kafka_bootstrap.split(",")[0])
        assert first is not None  # the settings refuse a list that does not read
        return first

    @property
    def es_host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.es_urls[0])  # the first node's (infra runs one)
        return parts.hostname or "127.0.0.1", parts.port or 9200

    @property
    def pg_host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.pg_dsn)
        return parts.hostname or "127.0.0.1", parts.port or 5432

    @property
    def keys_schema(self) -> str:
        """The PostgreSQL schema of the key store and the erasure records (beside the projection, never rebuilt)."""
        return self.key_schema or f"{self.pg_schema}_keys"

    @property
    def model_dir(self) -> Path:
        slug = self.embed_model.replace("/", "__")
        return self.embed_model_dir or self.data_dir / "models" / slug

    @property
    def rerank_dir(self) -> Path:
        """The cross-encoder's folder (recall's rerank stage)."""
        return self.rerank_model_dir or self.data_dir / "models" / self.rerank_model.replace("/", "__")

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"


def settings_problem(exc: BaseException) -> str | None:
    """One line saying which LEDGER_* variable keeps the settings from loading and what it should be; None when
    `exc` is not such a refusal. Command lines print it instead of a traceback. A value is never quoted (it may be
    a secret: a password in a DSN, an API key as a mapping's key); only names are (UnsafeSettings' schema, topic)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    if isinstance(exc, UnsafeSettings):
        return str(exc)
    if isinstance(exc, SettingsError):  # pydantic-settings reads a list or mapping variable as JSON
        found = re.search(r'field "(\w+)"', str(exc))
        name = f"LEDGER_{found.group(1).upper()}" if found else "a LEDGER_* variable"
        return f"{name} is not valid JSON (a list or mapping setting is written as JSON)"
    if isinstance(exc, ValidationError) and exc.title in (
        Settings.__name__,
        PublisherSettings.__name__,
        ClientSettings.__name__,
    ):
        prefix = "LEDGER_CLIENT_" if exc.title == ClientSettings.__name__ else "LEDGER_"
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            message = " ".join(str(error["msg"]).removeprefix("Value error, ").split())
            if error["loc"]:  # only the field: deeper parts of the path may be secrets (an API key)
                message = f"{prefix}{str(error['loc'][0]).upper()}: {message}"
            problems.append(message)
        return "; ".join(problems)
    return None


def unknown_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """A line for each LEDGER_* variable (of the environment or the `.env` file the settings read) that no setting
    reads, naming the setting it most looks like: the settings ignore a name they do not know, so a typo
    (`LEDGER_ENCRYPTON=on`) would leave its setting at its default unsaid. Names are read in any case, as the
    settings read them; the read client's LEDGER_CLIENT_* are its own."""
    written = {n.upper(): n for n in (os.environ if environ is None else environ)}  # name -> as written
    if environ is None:  # pydantic-settings reads .env names in lower case
        written |= {n.upper(): f"{n.upper()} (in .env)" for n in DotEnvSettingsSource(Settings).env_vars}
    known = [name.upper() for name in Settings.model_fields]
    lines = []
    for upper, name in sorted(written.items()):
        if upper.startswith("LEDGER_") and not upper.startswith("LEDGER_CLIENT_") and upper[7:] not in known:
            like = difflib.get_close_matches(upper[7:], known, n=1, cutoff=0.8)
            lines.append(f"{name} is no setting, ignored" + (f" (did you mean LEDGER_{like[0]}?)" if like else ""))
    return lines


@functools.lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()


class PublisherSettings(Settings):
    """The settings of a process that only publishes (the SDK in a service, `ledger publish`): the stack's, refusing
    only the development secrets it uses. It serves no API key, and opens PostgreSQL only for the key store, with
    encryption on and no key endpoint; so a service's machine need not set what only the servers read."""

    @model_validator(mode="after")
    def _safe(self) -> PublisherSettings:
        check_names(self)
        if not self.development:
            key_store = self.encryption != "off" and self.key_endpoint is None
            self._refuse_development_secrets(api_keys=False, postgres=key_store)
        return self


@functools.lru_cache(maxsize=1)
def get_publisher_settings() -> PublisherSettings:
    """A publishing process's settings (`PublisherSettings`), read once."""
    return PublisherSettings()


class ClientSettings(BaseSettings):
    """The read client's own settings (api.client): where the API is, with which key, how long to wait.

    Apart from `Settings` on purpose: a client runs where the server's settings do not (no LEDGER_DEVELOPMENT,
    no database, another machine) and must not refuse to start over them. Arguments of LedgerClient(...) win.
    """

    model_config = SettingsConfigDict(env_prefix="LEDGER_CLIENT_", env_file=".env", extra="ignore")

    url: str = "http://127.0.0.1:8000"  # the API's base URL (`ledger serve` binds 127.0.0.1:8000 by default)
    api_key: str | None = None  # None: no key is sent (every route but health and the schema answers 401)
    timeout_s: Seconds = 10.0  # bound on each phase of one request (connect, write, read, pool wait)

"""`ledger`: the command line (publish, topics, worker, rebuild, indexer, embedder, reindex, serve, mcp, demo, keys).

Each sub-command lives beside the code it drives and is only registered here. This root imports every layer's
commands, so it sits beside the installer (the operator's other entry), outside the layers: inside one it would
make that layer depend on all the others. Settings that do not load (the development key without
LEDGER_DEVELOPMENT, a variable that does not parse) end any of them the same way: one line on stderr naming the
variable (`producers.settings.settings_problem`) and exit code 2, never a traceback.
A store a command cannot reach (Kafka, PostgreSQL, Elasticsearch, or the API for `demo`) ends it the same way:
one line naming the store, its configured address and the setting to change (`store_problem`), exit code 3.
The servers (serve, mcp, worker, indexer, embedder) wait for an absent store by design instead. An error of the
system (output that cannot be written: a full disk) is one line with its reason, exit code 74 (EX_IOERR), apart
from a check's verdict (1).
"""

from __future__ import annotations

import errno
import os
import re
import sys
from typing import Any

import typer

STORE_UNREACHABLE = 3  # the exit code of a command that could not reach Kafka, PostgreSQL, Elasticsearch or the API
SYSTEM_ERROR = 74  # EX_IOERR: the system failed the command (its output could not be written): not a verdict's 1
_OUTPUT_LOST = {errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EDQUOT}


def _address(store: str, exc: BaseException) -> tuple[str, str]:
    """The configured address of `store` (never a DSN's password) and the setting that changes it."""
    from producers.settings import get_publisher_settings

    if store == "api":  # the address the command used (`demo --url` overrides the settings)
        url = exc.request.url  # type: ignore[attr-defined]
        return f"{url.host}:{url.port}", "--url or LEDGER_API_HOST/LEDGER_API_PORT"
    # only addresses are read: the settings that refuse least (a publisher's), which loaded if the command's did
    s = get_publisher_settings()
    if store == "key endpoint":
        return str(s.key_endpoint), "LEDGER_KEY_ENDPOINT"
    if store == "kafka":
        return s.kafka_bootstrap, "LEDGER_KAFKA_BOOTSTRAP"
    if store == "elasticsearch":
        return s.es_address, "LEDGER_ES_URL"
    from psycopg.conninfo import conninfo_to_dict

    dsn = conninfo_to_dict(s.pg_dsn)
    return f"{dsn.get('host', 'localhost')}:{dsn.get('port', 5432)}/{dsn.get('dbname', '')}", "LEDGER_PG_DSN"


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what caused it, outermost first (a chain of causes may loop back: each once)."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and all(seen is not c for c in chain):
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def store_problem(exc: BaseException) -> str | None:
    """One line naming the store a command could not reach (named as api.errors names them), its configured
    address and how to fix it; None when `exc` (or what caused it) is not a failure to connect."""
    import elastic_transport
    import httpx
    import kafka.errors as kafka_errors
    import psycopg

    from producers.sdk import PublishError

    unreachable = {
        "kafka": (kafka_errors.KafkaTimeoutError, kafka_errors.KafkaConnectionError),
        "postgres": (psycopg.OperationalError,),
        "elasticsearch": (elastic_transport.ConnectionError, elastic_transport.ConnectionTimeout),
        "api": (httpx.ConnectError,),
    }
    chain = _causes(exc)
    refused = next((e for e in chain if isinstance(e, kafka_errors.SaslAuthenticationFailedError)), None)
    if refused is not None:  # the broker is there and said no (the SDK wraps it): credentials to fix, not a store
        address, _ = _address("kafka", refused)
        return (
            f"kafka at {address} refused the login ({type(refused).__name__}): check LEDGER_KAFKA_SASL_USERNAME, "
            "LEDGER_KAFKA_SASL_PASSWORD and LEDGER_KAFKA_SASL_MECHANISM"
        )
    said_no = _refused(chain)
    if said_no is not None:
        return said_no
    for seen in chain:
        if isinstance(seen, PublishError) and seen.code == "unavailable":  # the SDK's word for a store away
            if seen.store == "keys":  # the key store answered but handed out no key (its key-encryption key)
                return f"no data key: {seen.reason}"
            # the broker, or where a sealed event's data key comes from: the key store's database or the API
            store, reason = {"api": "key endpoint"}.get(seen.store, seen.store), "unavailable"
        else:
            store = next((name for name, kinds in unreachable.items() if isinstance(seen, kinds)), "")
            reason = type(seen).__name__
        if store:
            address, setting = _address(store, seen)
            start = "`ledger serve`" if store in ("api", "key endpoint") else "`python -m infra up`"
            return f"{store} at {address} is not reachable ({reason}): start it ({start}) or set {setting}"
    return None


def _refused(chain: list[BaseException]) -> str | None:
    """PostgreSQL or Elasticsearch answered and said no (a login refused, a certificate the client does not trust):
    settings to fix, not a store to start. None for anything else."""
    import elastic_transport
    import elasticsearch
    import psycopg

    for seen in chain:
        text = str(seen)
        if isinstance(seen, psycopg.OperationalError):
            address, _ = _address("postgres", seen)
            if "password authentication failed" in text or "no pg_hba.conf entry" in text:
                return f"postgres at {address} refused the login: check the user, password and sslmode in LEDGER_PG_DSN"
            missing = re.search(r'FATAL:\s+(role|database) "[^"]*" does not exist', text)
            if missing:  # the server answered: it runs, the DSN names a user or database it does not have
                what = "user" if missing.group(1) == "role" else "database name"
                return f"postgres at {address} has no such {missing.group(1)}: check the {what} in LEDGER_PG_DSN"
            if "certificate" in text:  # libpq's "certificate verify failed", "server certificate ... does not match"
                return (
                    f"postgres at {address}: its TLS certificate is not trusted (not signed by sslrootcert's CA, or "
                    "not for this host name): check sslrootcert and the host in LEDGER_PG_DSN"
                )
        if isinstance(seen, elasticsearch.AuthenticationException):
            address, _ = _address("elasticsearch", seen)
            return f"elasticsearch at {address} refused the login (401): check the user and password in LEDGER_ES_URL"
        if isinstance(seen, elastic_transport.TlsError):
            address, _ = _address("elasticsearch", seen)
            if "CERTIFICATE_REQUIRED" in repr(seen):  # the node asks every client for a certificate of its own
                return (
                    f"elasticsearch at {address} asks for a client certificate: set LEDGER_ES_CLIENT_CERT and "
                    "LEDGER_ES_CLIENT_KEY"
                )
            return (
                f"elasticsearch at {address}: its TLS certificate is not trusted (not signed by a CA of "
                "LEDGER_ES_CA_CERTS, or not for this host name): check LEDGER_ES_CA_CERTS and LEDGER_ES_URL"
            )
    return None


class _Ledger(typer.Typer):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from producers.settings import unknown_names

        for line in unknown_names():  # a misspelt setting is said before the command runs on the default
            print(f"ledger: warning: {line}", file=sys.stderr)
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            from producers.keys.kek import KekError
            from producers.keys.signing import SigningKeyError
            from producers.settings import settings_problem

            problem = settings_problem(exc)
            if problem is None and isinstance(exc, KekError | SigningKeyError):  # a key's setting: its own words
                problem = str(exc)
            if problem is not None:
                print(f"ledger: the settings do not load: {problem}", file=sys.stderr)
                raise SystemExit(2) from None
            problem = store_problem(exc)
            if problem is None and isinstance(exc, OSError) and exc.errno is not None:
                if exc.filename is None and exc.errno in _OUTPUT_LOST:
                    _quiet_stdout()  # what could not be written is not tried again at the interpreter's exit
                where = f": {exc.filename}" if exc.filename else ""
                print(f"ledger: {exc.strerror or exc}{where}", file=sys.stderr)
                raise SystemExit(SYSTEM_ERROR) from None
            if problem is None:
                raise
            print(f"ledger: {problem}", file=sys.stderr)
            raise SystemExit(STORE_UNREACHABLE) from None


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what could not be written raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no stdout to point anywhere: nothing to flush either
        pass


app = _Ledger(add_completion=False, no_args_is_help=True, help="memory-ledger command line")


@app.command()
def serve(
    host: str | None = typer.Option(None, help="bind address (default: LEDGER_API_HOST)"),
    port: int | None = typer.Option(None, min=0, max=65535, help="port (default: LEDGER_API_PORT)"),
    workers: int = typer.Option(1, min=1, help="uvicorn worker processes"),
) -> None:
    """Run the HTTP API."""
    import uvicorn

    from producers.logs import configure_logging, logging_config
    from producers.settings import get_settings

    s = get_settings()
    configure_logging(s, "api")
    if workers > 1:  # one /metrics for all of uvicorn's processes (prometheus-client multiprocess mode)
        from api.metrics import prepare_multiprocess

        prepare_multiprocess(s.data_dir / "metrics" / f"api-{port or s.api_port}")
    # uvicorn's loggers through the same configuration, in each of its worker processes too
    uvicorn.run(
        "api.main:app",
        host=host or s.api_host,
        port=port or s.api_port,
        workers=workers,
        log_config=logging_config(s, "api"),
        log_level=s.log_level.lower(),
    )


@app.command()
def demo(
    url: str | None = typer.Option(None, help="base URL of a running service (default: LEDGER_API_HOST/PORT)"),
    api_key: str = typer.Option("dev-key", help="an API key bound to the tenant"),
    tenant: str = typer.Option("demo", help="tenant to write the demo facts into"),
) -> None:
    """Publish bilingual facts, update one, show its history and recall with explanations."""
    from api.demo import run

    run(url, api_key, tenant)


# the write path's commands live in producers/cli.py (imports only typer at module level)
from producers.cli import publish, schema, topics  # noqa: E402

app.command()(publish)
app.command()(topics)
app.command()(schema)  # the event contract as a JSON Schema (producers in other languages)

# the projector's commands live in stream_processors/cli.py (imports only typer at module level)
from stream_processors.cli import rebuild, verify, worker  # noqa: E402

app.command()(worker)
app.command()(rebuild)
app.command()(verify)  # the ledger against its chain, signed checkpoints and projection

# the search projection's commands live in projections/search/cli.py (imports only typer at module level)
from projections.search.cli import embedder, indexer, reindex  # noqa: E402

app.command()(indexer)
app.command()(embedder)
app.command()(reindex)

# the MCP server's command lives in api/mcp/cli.py (imports only typer at module level)
from api.mcp.cli import mcp  # noqa: E402

app.command()(mcp)

# the key-encryption keys' commands live in producers/keys/cli.py (imports only typer at module level)
from producers.keys.cli import keys_app  # noqa: E402

app.add_typer(keys_app, name="keys")


if __name__ == "__main__":
    app()

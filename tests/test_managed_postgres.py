"""LEDGER_PG_DSN against a PostgreSQL that asks what a managed one asks: TLS with a certificate the client checks,
and a password (SCRAM) for every login over TCP, on no other terms (`infra.pg_server`: its pg_hba.conf has only
`hostssl` lines). The server's certificate is signed by a CA this module makes (`tests.support.tls`).

Shown through the ledger's own connection code (`projections.postgres.connection.connect`, the schema's
`create_schema`, the projection's recorder, `ledger keys status`, `python -m infra status`): a DSN with
sslmode=verify-full, sslrootcert=<the CA> and the password connects over TLS (the server's `pg_stat_ssl` says so)
and the projection's schema is created and written through it; a CA that did not sign the server's certificate is
refused by the client, not retried in the clear; a wrong password is refused naming the login, and `ledger` says so
in one line naming LEDGER_PG_DSN, never the password; a client that asks for no TLS is refused by the server.
The shared PostgreSQL is not used: the server is this module's own, stopped and deleted at its end.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from infra.pg_server import PgServer
from infra.private import free_port
from infra.procs import service_dir
from producers.settings import Settings
from projections.postgres.connection import connect
from projections.postgres.schema import create_schema
from tests.conftest import unique
from tests.support.events import asserted
from tests.support.tls import Pki, make_pki
from tests.support.writer import RecorderWriter
from tests.test_cli_settings_errors import infra_status, run, user_env

PASSWORD = "pg-" + secrets.token_hex(12)  # unique: found in a text only if the text leaked it
WRONG = "wrong-" + secrets.token_hex(12)


@dataclass(frozen=True)
class TlsPostgres:
    server: PgServer
    pki: Pki  # the CA that signed the server's certificate
    other_ca: Pki  # a CA that signed nothing of the server's

    def dsn(self, password: str = PASSWORD, **params: str) -> str:
        return self.server.dsn("ledger", password, connect_timeout="5", **params)

    def verified(self, password: str = PASSWORD, ca: Pki | None = None) -> str:
        """The DSN a managed PostgreSQL's documentation gives: verify the certificate and the host name."""
        return self.dsn(password, sslmode="verify-full", sslrootcert=str((ca or self.pki).ca))


@pytest.fixture(scope="module")
def tls_pg(base_settings: Settings) -> Iterator[TlsPostgres]:
    base = service_dir(base_settings.data_dir, "pg-servers") / unique("tls")  # `postgres` reaches it
    pki, other = make_pki(base / "pki"), make_pki(base / "other-pki")
    server = PgServer(base_settings, base, free_port(), tls=(pki.cert, pki.key), logins={"ledger": PASSWORD})
    with server.running():  # stopped and deleted whatever the tests did
        yield TlsPostgres(server, pki, other)


def _tls_of_session(conn: psycopg.Connection) -> tuple[bool, str]:
    """What the server says of this session's connection: TLS or not, and its protocol version."""
    row = conn.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row is not None
    return row[0], row[1] or ""


def test_verify_full_with_the_ca_and_the_password_connects_over_tls(
    tls_pg: TlsPostgres, base_settings: Settings
) -> None:
    settings = base_settings.private(unique("pgtls"), pg_dsn=tls_pg.verified())
    with connect(settings.pg_dsn, settings.pg_schema) as conn:
        assert conn.info.pgconn.ssl_in_use
        ssl, version = _tls_of_session(conn)
        assert ssl and version.startswith("TLSv1."), (ssl, version)
        create_schema(conn, settings.pg_schema)
    with RecorderWriter(settings) as writer:  # the projection's recorder, as the worker runs it
        result = writer.apply(asserted("user:1", "profile.city", "Lyon"))
    assert result is not None
    with connect(settings.pg_dsn, settings.pg_schema) as conn:
        rows = conn.execute("SELECT subject, key FROM fact_versions").fetchall()
    assert rows == [("user:1", "profile.city")]
    # the operator's check of an external PostgreSQL connects with the same DSN
    status = infra_status("postgres", settings)
    assert status.returncode == 0 and "healthy" in status.stdout, status.stdout + status.stderr
    assert PASSWORD not in status.stdout + status.stderr


def test_a_ca_that_did_not_sign_the_server_is_refused_not_retried_in_the_clear(tls_pg: TlsPostgres) -> None:
    with pytest.raises(psycopg.OperationalError) as refused:
        connect(tls_pg.verified(ca=tls_pg.other_ca), "ledger")
    assert "certificate verify failed" in str(refused.value)
    # a plaintext retry would have met the server's refusal (no pg_hba.conf entry): the client never tried one
    assert "pg_hba.conf" not in str(refused.value)


def test_a_client_that_asks_for_no_tls_is_refused_by_the_server(tls_pg: TlsPostgres) -> None:
    with pytest.raises(psycopg.OperationalError, match="no pg_hba.conf entry .* no encryption"):
        connect(tls_pg.dsn(sslmode="disable"), "ledger")
    with connect(tls_pg.dsn(sslmode="prefer"), "ledger") as conn:  # libpq's default: TLS where the server has it
        assert _tls_of_session(conn)[0]


def test_a_wrong_password_is_refused_and_ledger_says_which_setting(
    tls_pg: TlsPostgres, base_settings: Settings
) -> None:
    with pytest.raises(psycopg.OperationalError, match='password authentication failed for user "ledger"'):
        connect(tls_pg.verified(WRONG), "ledger")
    port = tls_pg.server.server.port
    for dsn, says in (
        (tls_pg.verified(WRONG), "refused the login"),
        (tls_pg.verified(ca=tls_pg.other_ca), "certificate"),
    ):
        settings = base_settings.private(unique("pgtls"), pg_dsn=dsn)
        proc = run(("keys", "status"), user_env(**settings.as_env()))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 3 and len(lines) == 1, proc.stderr[-2000:]
        assert f"postgres at 127.0.0.1:{port}/ledger" in lines[0] and says in lines[0], lines[0]
        assert "LEDGER_PG_DSN" in lines[0] and "not reachable" not in lines[0], lines[0]
        assert WRONG not in proc.stderr + proc.stdout and PASSWORD not in proc.stderr + proc.stdout
    verified = base_settings.private(unique("pgtls"), pg_dsn=tls_pg.verified())
    good = run(("keys", "status"), user_env(**verified.as_env()))
    assert good.returncode == 0, good.stderr[-2000:]

"""A PostgreSQL server of its own on this machine, asking what a managed PostgreSQL asks of its clients: TLS, and a
password (SCRAM) for every login over TCP. For the tests of the ledger's connection settings (`LEDGER_PG_DSN`).

The stack's server (`infra.postgres`) is never touched: this one is a cluster of its own from the same Debian
binaries (`infra.postgres.install`), run as `postgres`, its data, Unix socket, pid file and log under `base_dir`
(which `postgres` must reach: `infra.procs.service_dir`), on a port the caller picks. Its pg_hba.conf has no `host`
line: a TCP login without TLS is refused by the server, whatever the client asks. The superuser comes in by the Unix
socket only (peer), to create the logins.

    with PgServer(settings, base_dir, port, tls=(cert, key), logins={"ledger": password}).running() as server:
        dsn = server.dsn("ledger", password, sslmode="verify-full", sslrootcert=str(ca))
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self
from urllib.parse import quote, urlencode

from infra.local_cluster import LocalCluster
from infra.postgres import install
from infra.procs import owned_pid, run, spawn, stop_owned
from producers.settings import Settings

__all__ = ["PgNode", "PgServer"]

PART = "postgres-server"
OWNER = {"user": "postgres", "group": "postgres"}


@dataclass(frozen=True)
class PgNode:
    """The one server: its port and its folder."""

    port: int
    home: Path
    host: str = "127.0.0.1"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def sock(self) -> Path:
        return self.home / "sock"

    @property
    def log(self) -> Path:
        return self.home / "postgres.log"

    @property
    def pid_file(self) -> Path:
        return self.home / "postgres.pid"


class PgServer(LocalCluster[PgNode]):
    """One server on `port`; `tls`: its certificate and key (PEM files, copied into its data folder); `logins`:
    {role: password}, each a login role, the first one owning the database `database`."""

    def __init__(
        self,
        settings: Settings,
        base_dir: Path,
        port: int,
        *,
        tls: tuple[Path, Path],
        logins: Mapping[str, str],
        database: str = "ledger",
    ) -> None:
        if not logins:
            raise ValueError("a server with no login would refuse every client")
        self.settings, self.base_dir, self.tls, self.logins, self.database = settings, base_dir, tls, logins, database
        self.part = PART
        self.nodes = [PgNode(port, base_dir)]

    @property
    def server(self) -> PgNode:
        return self.nodes[0]

    def dsn(self, user: str, password: str, **params: str) -> str:
        """A libpq URL of this server's database as `user`, with `params` (sslmode, sslrootcert, ...)."""
        n, query = self.server, f"?{urlencode(params)}" if params else ""
        login = f"{quote(user, safe='')}:{quote(password, safe='')}"
        return f"postgresql://{login}@{n.host}:{n.port}/{self.database}{query}"

    # -- lifecycle ---------------------------------------------------------------------------------

    def launch_all(self) -> None:
        n, bin_dir = self.server, install(self.settings)
        for d in (n.home, n.sock):
            d.mkdir(parents=True, exist_ok=True)
            shutil.chown(d, **OWNER)
        initdb = [str(bin_dir / "initdb"), "-D", str(n.data), "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8"]
        run([*initdb, "--auth-local=peer", "--auth-host=reject"], PART, n.log, **OWNER)
        cert, key = n.data / "server.crt", n.data / "server.key"
        shutil.copyfile(self.tls[0], cert)
        shutil.copyfile(self.tls[1], key)
        key.chmod(0o600)  # the server refuses a key others can read
        n.data.joinpath("pg_hba.conf").write_text(
            "local all postgres peer\n"
            "hostssl all all 127.0.0.1/32 scram-sha-256\n"
            "hostssl all all ::1/128 scram-sha-256\n"
        )
        for path in (cert, key, n.data / "pg_hba.conf"):
            shutil.chown(path, **OWNER)
        options = {
            "listen_addresses": n.host,
            "port": n.port,
            "unix_socket_directories": n.sock,
            "ssl": "on",
            "ssl_cert_file": cert,
            "ssl_key_file": key,
            "password_encryption": "scram-sha-256",
            "max_connections": 20,
            "shared_buffers": "16MB",
            "fsync": "off",  # a test's server: its data is deleted at the end
        }
        command = [str(bin_dir / "postgres"), "-D", str(n.data)]
        for name, value in options.items():
            command += ["-c", f"{name}={value}"]
        spawn(command, n.log, n.pid_file, user="postgres")

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server, wait until it answers, then create the logins and the database."""
        super().start(timeout)
        try:
            owner = next(iter(self.logins))
            for user, password in self.logins.items():
                self._psql(f"CREATE ROLE {_ident(user)} LOGIN PASSWORD {_literal(password)}")
            self._psql(f"CREATE DATABASE {_ident(self.database)} OWNER {_ident(owner)}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """SIGINT, PostgreSQL's fast shutdown (clients rolled back); SIGKILL after `timeout`."""
        n = self.server
        stop_owned(n.pid_file, str(n.data), signal.SIGINT, timeout)

    def healthy(self) -> bool:
        return self._psql("SELECT 1").stdout.strip() == "1"

    def addresses(self, node: PgNode) -> list[tuple[str, int]]:
        return [(node.host, node.port)]

    def log(self, node: PgNode) -> Path:
        return node.log

    def processes(self, node: PgNode) -> list[tuple[Path, int | None]]:
        """The postmaster (its command line names its own data folder: never another cluster's)."""
        return [(node.pid_file, owned_pid(node.pid_file, str(node.data)))]

    def _psql(self, statement: str) -> subprocess.CompletedProcess[str]:
        """`statement` run by the superuser through the Unix socket (never logged: it may hold a password)."""
        n, bin_dir = self.server, install(self.settings)
        psql = [str(bin_dir / "psql"), "-h", str(n.sock), "-p", str(n.port), "-U", "postgres", "-v", "ON_ERROR_STOP=1"]
        return run([*psql, "-tAc", statement], PART, None, **OWNER)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"

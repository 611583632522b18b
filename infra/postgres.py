"""PostgreSQL from Debian's package: a cluster of our own in the data folder, run as `postgres`.

A private cluster (own data directory, own port) keeps the ledger apart from any
cluster the machine already runs, and lets `down` stop exactly what `up` started.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
from pathlib import Path
from urllib.parse import unquote, urlsplit

from infra.procs import InfraError, owned_pid, port_open, run, service_dir, spawn, stop_owned, wait_until
from producers.settings import Settings

PART = "postgres"


def _paths(s: Settings) -> dict[str, Path]:
    base = service_dir(s.data_dir, "postgres")
    return {
        "base": base,
        "data": base / "data",
        "sock": base / "sock",
        "log": s.log_dir / "postgres.log",
        "pid": s.run_dir / "postgres.pid",
    }


def _bin_dir(s: Settings) -> Path | None:
    if s.pg_bin_dir:
        return s.pg_bin_dir
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def install(s: Settings) -> Path:
    """Install Debian's postgresql when absent; return the server's bin directory."""
    p = _paths(s)
    if _bin_dir(s) is None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "update", "-q"], PART, p["log"], env=env)
        run(["apt-get", "install", "-y", "-q", "postgresql"], PART, p["log"], env=env)
    bin_dir = _bin_dir(s)
    if bin_dir is None:
        raise InfraError(PART, "postgresql installed but no server binary under /usr/lib/postgresql", p["log"])
    return bin_dir


def _as_postgres() -> dict:
    return {"user": "postgres", "group": "postgres"}


def _initdb(s: Settings, bin_dir: Path) -> None:
    p = _paths(s)
    if (p["data"] / "PG_VERSION").exists():
        return
    user = pwd.getpwnam("postgres")
    for d in (p["base"], p["sock"]):
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, user.pw_uid, user.pw_gid)
    if p["data"].exists():
        shutil.rmtree(p["data"])
    run(
        [
            str(bin_dir / "initdb"),
            "-D",
            str(p["data"]),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ],
        PART,
        p["log"],
        **_as_postgres(),
    )


def pid(s: Settings) -> int | None:
    return owned_pid(_paths(s)["pid"], "postgres")


def _dsn_parts(s: Settings) -> tuple[str, str, str]:
    parts = urlsplit(s.pg_dsn)
    return unquote(parts.username or "ledger"), unquote(parts.password or ""), parts.path.lstrip("/") or "ledger"


def healthy(s: Settings) -> bool:
    import psycopg

    with psycopg.connect(s.pg_dsn, connect_timeout=3) as conn:
        conn.execute("SELECT 1")
    return True


def _create_role_and_db(s: Settings, bin_dir: Path) -> None:
    p = _paths(s)
    user, password, db = _dsn_parts(s)
    _, port = s.pg_host_port
    psql_bin = str(bin_dir / "psql") if (bin_dir / "psql").exists() else "psql"
    psql = [psql_bin, "-h", str(p["sock"]), "-p", str(port), "-U", "postgres", "-v", "ON_ERROR_STOP=1", "-tAc"]
    exists = run([*psql, f"SELECT 1 FROM pg_roles WHERE rolname = '{user}'"], PART, p["log"], **_as_postgres())
    pw = password.replace("'", "''")
    verb = "ALTER" if exists.stdout.strip() == "1" else "CREATE"
    # the statement goes in on stdin: a command line is in the log and in `ps` for every user to read
    statement = f"{verb} ROLE \"{user}\" LOGIN PASSWORD '{pw}'"
    run([*psql[:-1], "-tA"], PART, p["log"], input=statement, **_as_postgres())
    has_db = run([*psql, f"SELECT 1 FROM pg_database WHERE datname = '{db}'"], PART, p["log"], **_as_postgres())
    if has_db.stdout.strip() != "1":
        run([*psql, f'CREATE DATABASE "{db}" OWNER "{user}"'], PART, p["log"], **_as_postgres())


def start(s: Settings, timeout: float = 60.0) -> None:
    p = _paths(s)
    bin_dir = install(s)
    host, port = s.pg_host_port
    if not pid(s):
        if port_open(host, port):
            raise InfraError(PART, f"port {port} is taken by a process infra did not start")
        _initdb(s, bin_dir)
        spawn(
            [
                str(bin_dir / "postgres"),
                "-D",
                str(p["data"]),
                "-p",
                str(port),
                "-k",
                str(p["sock"]),
                "-c",
                f"listen_addresses={host}",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=512MB",
                "-c",
                "synchronous_commit=on",
                "-c",
                "fsync=on",
            ],
            p["log"],
            p["pid"],
            user="postgres",
        )
    try:
        wait_until(lambda: port_open(host, port), PART, timeout, p["log"], lambda: pid(s) is not None, "listening")
        _create_role_and_db(s, bin_dir)
        wait_until(lambda: healthy(s), PART, timeout, p["log"], lambda: pid(s) is not None)
    except InfraError:
        stop(s)
        raise


def stop(s: Settings) -> bool:
    # SIGINT is PostgreSQL's "fast" shutdown: roll back clients, checkpoint, exit
    return stop_owned(_paths(s)["pid"], "postgres", signal.SIGINT)


def describe(s: Settings) -> dict[str, str]:
    p = _paths(s)
    host, port = s.pg_host_port
    return {"address": f"{host}:{port}", "log": str(p["log"]), "data": str(p["data"])}

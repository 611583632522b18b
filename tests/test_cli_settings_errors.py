"""Settings that do not load are one line saying what is wrong and how to fix it, for every `ledger` command.

The commands are read from the command line itself (every command and sub-command typer registers), so a
new one is covered without being listed. Each runs as a user runs it, `ledger <command>`, in an environment
whose settings do not load: the default development key without LEDGER_DEVELOPMENT (what a new user's shell
holds); two of them also with a variable that does not parse (pydantic-settings' own refusal). Each must end
with one line on stderr naming the variable and exit 2, never a traceback; the commands that need no settings
(`schema`, `keys new-kek`) answer as usual, and so do `publish` and `topics` in the new user's shell (a publisher
refuses only the development secret it uses: tests/test_producers.py). The line itself is `settings_problem`,
tested here as a pure function on every kind of refusal `Settings` makes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest
import typer.main
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import ValidationError
from pydantic_settings import SettingsError

from infra.cli import app
from producers.keys.kek import new_kek
from producers.settings import REPO_ROOT, Settings, UnsafeSettings, settings_problem

LEDGER = str(Path(sys.executable).parent / "ledger")
NEED_NO_SETTINGS = {("schema",), ("keys", "new-kek")}
PUBLISHERS = {
    ("publish",),
    ("topics",),
}  # use neither the API's keys nor PostgreSQL (encryption off): their defaults pass
ARGUMENTS = {("publish",): ["-"]}  # a command's required arguments; publish reads stdin (empty here)


def commands() -> list[tuple[str, ...]]:
    """Every command path of `ledger`, sub-commands of a group included."""

    def walk(command: click.Command, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        subs = getattr(command, "commands", None)
        if not subs:
            return [path]
        return [found for name, sub in sorted(subs.items()) for found in walk(sub, (*path, name))]

    found = walk(typer.main.get_command(app), ())
    assert {("publish",), ("worker",), ("serve",), ("keys", "status")} <= set(found), found
    return found


def user_env(**ledger: str) -> dict[str, str]:
    """The caller's environment without any LEDGER_* variable (nor LEDGER_DEVELOPMENT), plus `ledger`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}, **ledger}


def run(path: tuple[str, ...], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    argv = [LEDGER, *path, *ARGUMENTS.get(path, [])]
    return subprocess.run(argv, env=env, cwd=REPO_ROOT, input=stdin, capture_output=True, text=True, timeout=90)


def infra_status(part: str, settings: Settings) -> subprocess.CompletedProcess[str]:
    """`python -m infra status PART` as an operator runs it against external stores (infra starts none of them)."""
    env = user_env(**settings.as_env(managed=["model"]))
    cmd = [sys.executable, "-m", "infra", "status", part]
    return subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def check_one_line(path: tuple[str, ...], proc: subprocess.CompletedProcess[str], variable: str) -> None:
    name = " ".join(path)
    assert "Traceback" not in proc.stderr + proc.stdout, f"ledger {name}:\n{proc.stderr[-3000:]}"
    if path in NEED_NO_SETTINGS or (path in PUBLISHERS and variable == "LEDGER_DEVELOPMENT"):
        assert proc.returncode == 0, f"ledger {name} needs no settings: {proc.stderr[-2000:]}"
        return
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"ledger {name} exited {proc.returncode}: {proc.stderr[-2000:]}"
    assert len(lines) == 1 and variable in lines[0], f"ledger {name}: {proc.stderr[-2000:]}"
    assert proc.stdout == "", f"ledger {name} wrote to stdout: {proc.stdout[:500]}"


def test_every_command_says_in_one_line_which_setting_is_wrong() -> None:
    """A new user's shell: the default development key, no LEDGER_DEVELOPMENT."""
    paths = commands()
    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(paths, pool.map(lambda p: run(p, user_env()), paths), strict=True))
    for path, proc in done.items():
        check_one_line(path, proc, "LEDGER_DEVELOPMENT")


def test_a_variable_that_does_not_parse_is_one_line_too() -> None:
    """Another kind of refusal (pydantic-settings' own, before any validation), through the same door."""
    for path in [("publish",), ("keys", "status")]:
        proc = run(path, user_env(LEDGER_DEVELOPMENT="1", LEDGER_API_KEYS="{dev-key: [demo]"))
        check_one_line(path, proc, "LEDGER_API_KEYS")


def test_a_dsn_libpq_cannot_read_or_that_names_what_the_server_lacks_is_one_line(base_settings: Settings) -> None:
    """A DSN that is no connection string is refused when the settings load (exit 2, never quoted: it may hold a
    password); one naming a user or database the running server lacks says so (exit 3), not that the server is
    unreachable and should be started."""
    for path in [("verify",), ("keys", "status")]:
        proc = run(path, user_env(LEDGER_DEVELOPMENT="1", LEDGER_PG_DSN="garbage s3cret"))
        check_one_line(path, proc, "LEDGER_PG_DSN")
        assert "s3cret" not in proc.stderr
    dsn = conninfo_to_dict(base_settings.pg_dsn)
    for over, says in (({"user": "nobody_here"}, "no such role: check the user"),
                       ({"dbname": "no_such_db"}, "no such database: check the database name")):  # fmt: skip
        env = user_env(LEDGER_DEVELOPMENT="1", LEDGER_PG_DSN=make_conninfo(**{**dsn, **over}), LEDGER_KEK=new_kek())
        proc = run(("keys", "status"), env)
        line = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert line.startswith("ledger: postgres at ") and says in line and "LEDGER_PG_DSN" in line, line


def test_a_key_setting_that_does_not_load_is_one_line_too(tmp_path: Path) -> None:
    """The key-encryption key is read when a producer starts, after the settings loaded: a file that cannot be read,
    a key that is not one, or encryption on without a key is one line naming the variable, never a traceback."""
    event = '{"type": "memory.asserted", "tenant": "demo", "event_id": "kek-1", "subject": "u", "key": "k", '
    event += '"content": "c", "value": 1}\n'
    for env, variable in (
        ({"LEDGER_KEK_FILE": str(tmp_path / "missing")}, "LEDGER_KEK_FILE"),
        ({"LEDGER_KEK": "not-a-key"}, "key-encryption key"),
        ({}, "LEDGER_KEK"),
    ):
        proc = run(("publish",), user_env(LEDGER_DEVELOPMENT="1", LEDGER_ENCRYPTION="on", **env), stdin=event)
        check_one_line(("publish",), proc, variable)


def refusal(monkeypatch: pytest.MonkeyPatch, **env: str) -> Exception:
    for name in [k for k in os.environ if k.startswith("LEDGER_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises((ValidationError, SettingsError, UnsafeSettings)) as caught:
        Settings()
    return caught.value


@pytest.mark.unit
@pytest.mark.parametrize(
    ("env", "variable", "says"),
    [
        ({}, "LEDGER_API_KEYS", "LEDGER_DEVELOPMENT=1"),  # the development key, refused outside development
        ({"LEDGER_API_KEYS": '{"k": ["demo"]}'}, "LEDGER_PG_DSN", "LEDGER_DEVELOPMENT=1"),  # the local password
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_API_PORT": "eighty"}, "LEDGER_API_PORT", "integer"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_ENCRYPTION": "maybe"}, "LEDGER_ENCRYPTION", "'required'"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_API_KEYS": "[oops"}, "LEDGER_API_KEYS", "JSON"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_API_KEYS": '{"k": "demo"}'}, "LEDGER_API_KEYS", "list"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_PG_SCHEMA": "My Schema"}, "LEDGER_PG_SCHEMA", "lower-case"),
        ({"LEDGER_DEVELOPMENT": "maybe"}, "LEDGER_DEVELOPMENT", "boolean"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_PG_DSN": "garbage"}, "LEDGER_PG_DSN", "connection string"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_PG_DSN": "host=x port"}, "LEDGER_PG_DSN", "connection string"),
        # kafka-python's own refusals came later as a traceback, or as "kafka is not reachable" while it ran
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_KAFKA_BOOTSTRAP": "host:notaport"}, "LEDGER_KAFKA_BOOTSTRAP", "host:port"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_KAFKA_BOOTSTRAP": "a:9092, :1"}, "LEDGER_KAFKA_BOOTSTRAP", "host:port"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_KAFKA_BOOTSTRAP": "a:99999"}, "LEDGER_KAFKA_BOOTSTRAP", "host:port"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_PRODUCER_TIMEOUT_S": "600"}, "LEDGER_PRODUCER_TIMEOUT_S", "300"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_PG_CONNECT_TIMEOUT_S": "9" * 23}, "LEDGER_PG_CONNECT_TIMEOUT_S", "300"),
        ({"LEDGER_DEVELOPMENT": "1", "LEDGER_PG_CONNECT_TIMEOUT_S": "-1"}, "LEDGER_PG_CONNECT_TIMEOUT_S", "2"),
    ],
)
def test_a_refusal_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], variable: str, says: str
) -> None:
    line = settings_problem(refusal(monkeypatch, **env))
    assert line is not None and "\n" not in line and variable in line and says in line, line


@pytest.mark.unit
def test_a_refused_value_is_never_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values may be secrets (an API key is a mapping's key, a DSN holds a password): the line names, never quotes."""
    line = settings_problem(refusal(monkeypatch, LEDGER_DEVELOPMENT="1", LEDGER_API_KEYS='{"s3cret": "demo"}'))
    assert line is not None and "LEDGER_API_KEYS" in line and "s3cret" not in line, line
    line = settings_problem(refusal(monkeypatch, LEDGER_DEVELOPMENT="1", LEDGER_API_PORT="s3cret"))
    assert line is not None and "LEDGER_API_PORT" in line and "s3cret" not in line, line


@pytest.mark.unit
def test_other_errors_are_not_taken_for_settings() -> None:
    assert settings_problem(ValueError("no")) is None
    assert settings_problem(KeyError("LEDGER_API_PORT")) is None


@pytest.mark.unit
def test_every_duration_setting_refuses_no_time_naming_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The class: a duration of 0, below 0 or not finite was taken, and showed up later as something else (a broker
    said "not reachable" while Kafka ran, for LEDGER_PRODUCER_TIMEOUT_S=-1). Every setting in seconds refuses it at
    load, in one line naming its variable."""
    import annotated_types

    durations = [
        name
        for name, info in Settings.model_fields.items()
        if any(isinstance(m, annotated_types.Gt) and m.gt == 0 for m in info.metadata) and name.endswith("_s")
    ]
    assert {"producer_timeout_s", "api_kafka_timeout_s", "access_flush_s", "pg_pool_timeout_s"} <= set(durations)
    for name in durations:
        for value in ("0", "-1", "nan", "inf"):
            line = settings_problem(refusal(monkeypatch, LEDGER_DEVELOPMENT="1", **{f"LEDGER_{name.upper()}": value}))
            assert line is not None and f"LEDGER_{name.upper()}" in line, (name, value, line)


@pytest.mark.unit
def test_every_port_setting_refuses_what_no_socket_binds_naming_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The class: a port past 65535 or below 0 was taken, and `ledger serve` then failed in uvicorn's tracebacks
    after "startup complete" (the MCP server in a pydantic error of the SDK's)."""
    ports = [name for name in Settings.model_fields if name.endswith("_port")]
    assert {"api_port", "mcp_port", "worker_metrics_port"} <= set(ports)
    for name in ports:
        for value in ("-1", "65536", "99999"):
            line = settings_problem(refusal(monkeypatch, LEDGER_DEVELOPMENT="1", **{f"LEDGER_{name.upper()}": value}))
            assert line is not None and f"LEDGER_{name.upper()}" in line, (name, value, line)
        monkeypatch.setenv(f"LEDGER_{name.upper()}", "65535")
        assert getattr(Settings(), name) == 65535


def test_a_misspelt_setting_is_said_before_the_command_runs_on_its_default() -> None:
    """The settings ignore a name they do not know: `LEDGER_ENCRYPTON=on` left encryption off, unsaid."""
    env = user_env(LEDGER_DEVELOPMENT="1", LEDGER_ENCRYPTON="on", LEDGER_NOTHING_LIKE_IT="1", LEDGER_CLIENT_URL="x")
    proc = run(("schema",), env)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("ledger: warning: ")]
    assert warnings == [
        "ledger: warning: LEDGER_ENCRYPTON is no setting, ignored (did you mean LEDGER_ENCRYPTION?)",
        "ledger: warning: LEDGER_NOTHING_LIKE_IT is no setting, ignored",
    ], proc.stderr  # the read client's LEDGER_CLIENT_* are its own
    assert proc.returncode == 0, proc.stderr


@pytest.mark.unit
def test_a_bootstrap_list_reads_as_kafka_python_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each server is host:port, an IPv6 address bracketed; a server without a port, which infra's health check could
    not read, and one with a scheme, which the worker's faust reads as a host named after it, are refused."""
    for value, first in (
        ("kafka-1.internal:9092", ("kafka-1.internal", 9092)),
        ("[::1]:9092, b_2:9093", ("::1", 9092)),
        ("10.0.0.7:19092,10.0.0.8:19092", ("10.0.0.7", 19092)),
    ):
        monkeypatch.setenv("LEDGER_KAFKA_BOOTSTRAP", value)
        monkeypatch.setenv("LEDGER_DEVELOPMENT", "1")
        assert Settings().kafka_host_port == first, value
    for value in ("kafka-1", "::1", "a:9092,", "a:0", "PLAINTEXT://kafka-1:9092", "SSL://b:9093"):
        line = settings_problem(refusal(monkeypatch, LEDGER_DEVELOPMENT="1", LEDGER_KAFKA_BOOTSTRAP=value))
        assert line is not None and "LEDGER_KAFKA_BOOTSTRAP" in line, (value, line)


@pytest.mark.unit
def test_a_misspelt_name_in_dotenv_is_said_and_a_name_in_another_case_is_read(monkeypatch, tmp_path) -> None:
    """The settings read names in any case and from `.env` too: neither is a name they ignore, nor a typo there."""
    from producers.settings import unknown_names

    for name in [k for k in os.environ if k.upper().startswith("LEDGER_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("LEDGER_ENCRYPTON=on\nLEDGER_API_PORT=8124\n")
    monkeypatch.setenv("LEDGER_Mcp_Port", "8125")
    assert unknown_names() == ["LEDGER_ENCRYPTON (in .env) is no setting, ignored (did you mean LEDGER_ENCRYPTION?)"]


@pytest.mark.unit
def test_every_batch_size_setting_refuses_less_than_one_naming_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The class: a batch of 0 or fewer was taken at load (an indexer claiming no rows, for ever)."""
    sizes = [name for name in Settings.model_fields if name.endswith("_batch_size")]
    assert {"processor_batch_size", "indexer_batch_size", "embedder_batch_size", "access_batch_size"} <= set(sizes)
    for name in sizes:
        for value in ("0", "-5"):
            line = settings_problem(refusal(monkeypatch, LEDGER_DEVELOPMENT="1", **{f"LEDGER_{name.upper()}": value}))
            assert line is not None and f"LEDGER_{name.upper()}" in line, (name, value, line)

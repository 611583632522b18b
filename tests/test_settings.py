"""Settings validators (pure): development secrets and unsafe names never reach a deployment."""

from __future__ import annotations

import pytest

from producers.settings import DEV_API_KEY, PublisherSettings, Settings, UnsafeSettings

pytestmark = pytest.mark.unit

SAFE = {"api_keys": {"k-9f2c": ["acme"]}, "pg_dsn": "postgresql://ledger:s3cret@db.internal:5432/ledger"}


@pytest.fixture(autouse=True)
def _no_ledger_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The validators judge the arguments given: pydantic-settings merges a dict from the environment into a dict
    argument (LEDGER_API_KEYS holding the development key would join `api_keys`), so none is read here."""
    import os

    for name in [n for n in os.environ if n.startswith("LEDGER_")]:
        monkeypatch.delenv(name)


def test_a_deployment_refuses_the_development_key_and_password() -> None:
    with pytest.raises(ValueError, match="LEDGER_API_KEYS"):
        Settings(development=False, pg_dsn=SAFE["pg_dsn"])  # the default key is the development key
    with pytest.raises(ValueError, match="LEDGER_PG_DSN"):
        Settings(development=False, api_keys=SAFE["api_keys"])  # the default DSN has the local password
    assert Settings(development=False, **SAFE).development is False


def test_a_publisher_refuses_only_the_development_secret_it_uses() -> None:
    """It serves no key, and opens PostgreSQL only for the key store (encryption on, no key endpoint)."""
    assert DEV_API_KEY in PublisherSettings(development=False).api_keys
    with pytest.raises(ValueError, match="LEDGER_PG_DSN"):
        PublisherSettings(development=False, encryption="on")
    with pytest.raises(ValueError, match="LEDGER_PG_DSN"):
        PublisherSettings(development=False, encryption="required")
    assert PublisherSettings(development=False, encryption="on", key_endpoint="http://api:8000").encryption == "on"
    assert PublisherSettings(development=False, encryption="on", pg_dsn=SAFE["pg_dsn"]).encryption == "on"
    with pytest.raises(ValueError, match="LEDGER_TOPIC"):  # names are checked as for every process
        PublisherSettings(development=False, topic="a b")


def test_development_mode_allows_them() -> None:
    s = Settings(development=True)
    assert DEV_API_KEY in s.api_keys


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pg_schema", "Ledger"),
        ("pg_schema", 'x"; DROP SCHEMA ledger; --'),
        ("pg_schema", "a-b"),
        ("pg_schema", "x" * 64),
        ("pg_schema", ""),
        ("topic", "memory events"),
        ("topic", ".."),
        ("dlq_topic", "dlq/x"),
        ("es_index", "Memory"),
        ("es_index", "_hidden"),
        ("es_index", "a,b"),
    ],
)
def test_names_that_reach_sql_topics_and_indices_are_checked(field: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"LEDGER_{field.upper()}"):
        Settings(development=True, **{field: value})


def test_private_copies_are_checked_too() -> None:
    base = Settings(development=True)
    assert base.private("t_abc").pg_schema == "t_abc"
    with pytest.raises(UnsafeSettings):
        base.private('t"; --')


def test_every_setting_has_its_row_in_the_readme() -> None:
    """The README's settings table names every variable a process reads: a setting nobody can find is one nobody
    sets right."""
    from producers.settings import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("\n## Configuration and external clusters\n", 1)[1].split("\n## ", 1)[0]
    rows = "\n".join(line for line in section.splitlines() if line.startswith("| `LEDGER_"))
    missing = [f"LEDGER_{name.upper()}" for name in Settings.model_fields if f"`LEDGER_{name.upper()}`" not in rows]
    assert not missing, f"settings without a row in the README's settings table: {missing}"

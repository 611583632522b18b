"""Fixtures for tests against the real servers that `python -m infra up` started.

Each test gets private names (topic, PostgreSQL schema, Elasticsearch index) on the
shared servers, so tests never see each other's data. A server that does not answer
fails the test: nothing here skips.
"""

from __future__ import annotations

import os

import pytest

# the local stack runs with the development key and password (producers.settings refuses them
# otherwise); children (workers, indexers, servers) inherit it
os.environ.setdefault("LEDGER_DEVELOPMENT", "1")

from infra.private import unique_name
from producers.settings import Settings, get_settings

unique = unique_name  # every test's private names: the same rule as the benchmarks'


@pytest.fixture(scope="session")
def base_settings() -> Settings:
    return get_settings()


@pytest.fixture
def settings(base_settings: Settings) -> Settings:
    """Settings with a private topic, DLQ, consumer group, schema and index for this test."""
    return base_settings.private(unique("t"))


# -- the browser tests (the console, the offline docs): one Chromium per module, a page per test ------------------


@pytest.fixture(scope="module")
def browser():
    from tests.support.browser import chromium  # Playwright only where a test asks for a browser

    with chromium() as b:
        yield b


@pytest.fixture
def tab(world, browser):
    """A page on the module's `world` (anything with the served `url`): it asks nothing outside the service and
    its script throws nothing, checked after each test."""
    from tests.support.browser import OfflinePage

    with OfflinePage(browser, world.url) as t:
        yield t
        assert t.blocked == [], "the console asked for something outside the service"
        assert t.errors == [], "the console's script threw"

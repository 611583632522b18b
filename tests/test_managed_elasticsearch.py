"""LEDGER_ES_URL and LEDGER_ES_CA_CERTS / LEDGER_ES_CLIENT_CERT / LEDGER_ES_CLIENT_KEY against an Elasticsearch node
with security on, as a managed cluster has it: HTTPS (and transport TLS) with a certificate signed by a CA this
module makes (`tests.support.tls`), the built-in `elastic` user's password, and a client certificate required of
every HTTPS client (`infra.es_cluster.EsSecurity`, one node of the integ-test zip the stack runs).

Shown through the ledger's own client (`projections.search.client.es_client` of the settings) and `ledger reindex`:
with the user and password in the URL, the CA and the client certificate, the indexer creates the index and writes a
version that a search then finds; a CA that did not sign the node's certificate, and a client without its
certificate, are refused in the TLS handshake (the URL is https: nothing is sent in the clear); a wrong password is
refused with Elasticsearch's 401, and `ledger` says so in one line naming LEDGER_ES_URL, never the password.
PostgreSQL is the shared server (private schema); the node is this module's own, stopped and deleted at its end.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import elastic_transport
import elasticsearch
import pytest
from pydantic import ValidationError

from infra.es_cluster import EsCluster, EsSecurity
from infra.private import free_ports
from infra.procs import service_dir
from producers.settings import Settings, settings_problem
from projections.search.client import async_es_client, es_client
from tests.conftest import unique
from tests.support import RecorderWriter, drain_all, private_store
from tests.support.events import asserted
from tests.support.tls import Pki, make_pki
from tests.test_cli_settings_errors import infra_status, run, user_env

PASSWORD = "es-" + secrets.token_hex(12)  # unique: found in a text only if the text leaked it
WRONG = "wrong-" + secrets.token_hex(12)


@dataclass(frozen=True)
class SecureEs:
    node: EsCluster
    other_ca: Pki  # a CA that signed nothing of the node's

    def on(self, settings: Settings, password: str | None = None, **update: object) -> Settings:
        """`settings` on the node as `elastic` (`password`: another one than its own), with `update`."""
        return self.node.client_settings(settings, password).model_copy(update=update)


@pytest.fixture(scope="module")
def secure_es(base_settings: Settings) -> Iterator[SecureEs]:
    base = service_dir(base_settings.data_dir, "elasticsearch-cluster") / unique("tls")  # the service user reaches it
    pki, other = make_pki(base / "pki"), make_pki(base / "other-pki")
    security = EsSecurity(
        pki.cert,
        pki.key,
        pki.ca,
        PASSWORD,
        client_auth="required",
        client_cert=pki.client_cert,
        client_key=pki.client_key,
    )
    ports = free_ports(2)
    node = EsCluster(base_settings, base, [(ports[0], ports[1])], heap="256m", security=security)
    with node.running(timeout=150):  # stopped and deleted whatever the tests did
        yield SecureEs(node, other)


def test_https_with_the_password_the_ca_and_a_client_certificate_indexes_and_searches(
    secure_es: SecureEs, base_settings: Settings
) -> None:
    settings = secure_es.on(base_settings.private(unique("estls")))
    assert settings.es_url.startswith("https://elastic:") and settings.es_ca_certs is not None
    with private_store(settings) as (conn, es):  # the shared PostgreSQL; es: the ledger's client of the settings
        assert es.security.authenticate()["username"] == "elastic"
        with RecorderWriter(settings) as writer:
            writer.apply(asserted("user:1", "profile.city", "Lyon", content="user 1 lives in Lyon"))
        assert drain_all(settings, conn, es, None) == 1  # the indexer made the index and wrote the version
        hits = es.search(index=settings.es_index, query={"match": {"content": "Lyon"}})["hits"]["hits"]
        assert [h["_source"]["subject"] for h in hits] == ["user:1"]
        proc = run(("reindex", "--no-embed"), user_env(**settings.as_env()))  # `ledger reindex` as a user runs it
        assert proc.returncode == 0 and "1 documents" in proc.stdout, proc.stderr[-2000:]
        assert PASSWORD not in proc.stdout + proc.stderr
    # the operator's check of an external cluster logs in as the clients do, and shows the address without the login
    status = infra_status("elasticsearch", settings)
    assert status.returncode == 0 and "healthy" in status.stdout, status.stdout + status.stderr
    assert settings.es_address in status.stdout and PASSWORD not in status.stdout + status.stderr


def test_a_ca_that_did_not_sign_the_node_and_a_client_without_its_certificate_are_refused(
    secure_es: SecureEs, base_settings: Settings
) -> None:
    settings = secure_es.on(base_settings)
    other_ca = secure_es.on(settings, es_ca_certs=secure_es.other_ca.ca)
    no_client_cert = secure_es.on(settings, es_client_cert=None, es_client_key=None)
    for refused_settings, says in ((other_ca, "CERTIFICATE_VERIFY_FAILED"), (no_client_cert, "CERTIFICATE_REQUIRED")):
        with (
            es_client(refused_settings, request_timeout=5, max_retries=0) as es,
            pytest.raises(elastic_transport.TlsError) as no,
        ):
            es.cluster.health()
        assert says in repr(no.value), repr(no.value)
    with es_client(settings, request_timeout=5) as es:  # the same node, the right files
        assert es.cluster.health()["status"] == "green"


def test_a_wrong_password_is_refused_and_ledger_says_which_setting(
    secure_es: SecureEs, base_settings: Settings
) -> None:
    good = secure_es.on(base_settings.private(unique("estls")))
    bad = secure_es.on(good, password=WRONG)
    with es_client(bad, request_timeout=5) as es, pytest.raises(elasticsearch.AuthenticationException) as refused:
        es.cluster.health()
    assert refused.value.meta.status == 401 and "unable to authenticate user [elastic]" in str(refused.value)
    port = secure_es.node.nodes[0].http_port
    with private_store(good):  # the schema `ledger reindex` reads first: each run below gets as far as Elasticsearch
        for settings, says in (
            (bad, "refused the login (401)"),
            (secure_es.on(good, es_ca_certs=secure_es.other_ca.ca), "certificate is not trusted"),
            (secure_es.on(good, es_client_cert=None, es_client_key=None), "LEDGER_ES_CLIENT_CERT"),
        ):
            proc = run(("reindex", "--no-embed"), user_env(**settings.as_env()))
            # the client's own log records come first (it retries a failed handshake, logging each with its cause)
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("ledger: ")]
            assert proc.returncode == 3 and len(lines) == 1, proc.stderr[-2000:]
            assert proc.stderr.strip().splitlines()[-1] == lines[0], proc.stderr[-2000:]
            assert f"elasticsearch at https://127.0.0.1:{port}" in lines[0] and says in lines[0], lines[0]
            assert "LEDGER_ES" in lines[0] and "not reachable" not in lines[0], lines[0]
            assert WRONG not in proc.stderr + proc.stdout and PASSWORD not in proc.stderr + proc.stdout


# -- the settings, no server ----------------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_tls_files_reach_every_node_of_both_clients(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    s = Settings(
        development=True,
        es_url="https://u:p@10.0.0.1:9243,https://u:p@10.0.0.2:9243",
        es_ca_certs=pki.ca,
        es_client_cert=pki.client_cert,
        es_client_key=pki.client_key,
    )
    expected = [(str(pki.ca), str(pki.client_cert), str(pki.client_key))] * 2
    assert s.es_address == "https://10.0.0.1:9243,https://10.0.0.2:9243"  # what messages show: no login

    def files(client: elasticsearch.Elasticsearch | elasticsearch.AsyncElasticsearch) -> list[tuple[str, str, str]]:
        configs = [n.config for n in client.transport.node_pool.all()]
        return [(c.ca_certs, c.client_cert, c.client_key) for c in configs]

    with es_client(s, request_timeout=1) as es:
        assert files(es) == expected

    async def api_client() -> list[tuple[str, str, str]]:
        async with async_es_client(s, request_timeout=1) as aes:
            return files(aes)

    assert asyncio.run(api_client()) == expected
    with es_client(Settings(development=True), request_timeout=1) as es:  # the default: no file, the system's CAs
        assert files(es) == [(None, None, None)]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"es_ca_certs": "/etc/ca.pem"}, "LEDGER_ES_CA_CERTS"),
        ({"es_url": "https://a:9243,http://b:9200", "es_client_cert": "/c.pem"}, "not https://"),
        ({"es_url": "https://a:9243", "es_client_key": "/k.pem"}, "LEDGER_ES_CLIENT_CERT"),
    ],
)
def test_tls_files_that_cannot_be_used_are_refused_naming_the_variable(fields: dict, names: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(development=True, **fields)
    problem = settings_problem(refused.value)
    assert problem is not None and names in problem

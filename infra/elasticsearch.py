"""Elasticsearch single node from Maven Central's integ-test-zip, run as a service user.

Elasticsearch refuses to run as root, so its home and data live under a folder
owned by the service user; ES 9 needs Java 21+, found among the machine's JDKs.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import zipfile
from collections.abc import Sequence
from pathlib import Path

from infra.maven import fetch_artifact
from infra.procs import (
    InfraError,
    already_up,
    healthy_or_stopped,
    launch,
    owned_pid,
    port_open,
    run,
    service_dir,
    stop_owned,
)
from producers.settings import Settings
from projections.search.client import es_client

PART = "elasticsearch"
MARKER = "org.elasticsearch"


def _paths(s: Settings) -> dict[str, Path]:
    base = service_dir(s.data_dir, "elasticsearch")
    return {
        "base": base,
        "home": base / f"elasticsearch-{s.es_version}",
        "data": base / "data",
        "logs": base / "logs",
        "log": s.log_dir / "elasticsearch.log",
        "pid": base / "es.pid",
    }


def java_home(s: Settings) -> Path:
    if s.es_java_home:
        return s.es_java_home
    candidates = []
    for home in Path("/usr/lib/jvm").glob("*"):
        java = home / "bin" / "java"
        if not java.exists() or home.is_symlink():
            continue
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True).stderr
        try:
            major = int(out.split('"')[1].split(".")[0])
        except (IndexError, ValueError):
            continue
        if major >= 21:
            candidates.append((major, home))
    if not candidates:
        raise InfraError(PART, "Elasticsearch 9 needs Java 21+ and none is in /usr/lib/jvm; set LEDGER_ES_JAVA_HOME")
    return max(candidates)[1]


def _ensure_user(s: Settings) -> None:
    try:
        pwd.getpwnam(s.es_user)
    except KeyError:
        run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", s.es_user], PART)


def unpack(s: Settings) -> Path:
    """Fetch the zip once (cached by Maven) and unpack it into the data folder, owned by the service user; the
    home folder. Every node on this machine runs from it: the single node and a cluster's (infra.es_cluster)."""
    p = _paths(s)
    _ensure_user(s)
    if not (p["home"] / "bin" / "elasticsearch").exists():
        archive = fetch_artifact(
            f"org.elasticsearch.distribution.integ-test-zip:elasticsearch:{s.es_version}", PART, p["log"], "zip"
        )
        p["base"].mkdir(parents=True, exist_ok=True)
        tmp = p["base"] / ".unpack"
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)
        for member in tmp.rglob("*"):
            if member.parent.name == "bin" or member.name.endswith((".sh",)) or "/bin/" in str(member):
                member.chmod(0o755)
        (tmp / f"elasticsearch-{s.es_version}").rename(p["home"])
        shutil.rmtree(tmp, ignore_errors=True)
        give_to(s, p["base"])
    return p["home"]


def node_config(
    *,
    cluster: str,
    node: str,
    host: str,
    http_port: int,
    transport: str,
    data: Path,
    logs: Path,
    discovery: list[str],
    security: Sequence[str] = ("xpack.security.enabled: false",),
) -> str:
    """One node's elasticsearch.yml: the single node's and each cluster node's differ only by the arguments
    (`security`: its `xpack.security.*` lines; off by default)."""
    return "\n".join(
        [
            f"cluster.name: {cluster}",
            f"node.name: {node}",
            *discovery,
            f"network.host: {host}",
            f"http.port: {http_port}",
            f"transport.port: {transport}",
            f"path.data: {data}",
            f"path.logs: {logs}",
            *security,
            "action.destructive_requires_name: false",
            "cluster.routing.allocation.disk.threshold_enabled: false",
            "",
        ]
    )


def give_to(s: Settings, folder: Path) -> None:
    """Make `folder` and everything in it the service user's (Elasticsearch refuses to run as root)."""
    user = pwd.getpwnam(s.es_user)
    for path in [folder, *folder.rglob("*")]:
        try:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
        except FileNotFoundError:
            pass


def install(s: Settings) -> None:
    """Unpack the zip (once) and configure the single node."""
    p = _paths(s)
    unpack(s)
    host, port = s.es_host_port
    (p["home"] / "config" / "elasticsearch.yml").write_text(
        node_config(
            cluster="memory-ledger",
            node="ledger-node-1",
            host=host,
            http_port=port,
            transport="9300-9400",
            data=p["data"],
            logs=p["logs"],
            discovery=["discovery.type: single-node"],
        )
    )
    (p["home"] / "config" / "jvm.options.d").mkdir(exist_ok=True)
    (p["home"] / "config" / "jvm.options.d" / "heap.options").write_text(f"-Xms{s.es_heap}\n-Xmx{s.es_heap}\n")
    for d in (p["data"], p["logs"]):
        d.mkdir(parents=True, exist_ok=True)
    give_to(s, p["base"])


def pid(s: Settings) -> int | None:
    return owned_pid(_paths(s)["pid"], MARKER)


def healthy(s: Settings) -> bool:
    """The cluster answers green or yellow, asked as the ledger's clients ask (an external cluster's login and TLS);
    its port first, so a node still starting is not a failed request (the client logs each)."""
    if not port_open(*s.es_host_port):
        return False
    with es_client(s, request_timeout=3, max_retries=0) as es:
        return es.cluster.health()["status"] in ("green", "yellow")


def start(s: Settings, timeout: float = 180.0) -> None:
    p = _paths(s)
    if already_up(PART, lambda: pid(s), lambda: healthy(s), s.es_host_port, timeout, p["log"]):
        return
    install(s)
    p["pid"].unlink(missing_ok=True)
    env = {"ES_JAVA_HOME": str(java_home(s)), "ES_PATH_CONF": str(p["home"] / "config")}
    # -d daemonizes after the node started; the pid file holds the server JVM's pid. A session of its own, as every
    # server here: with the kernel's autogroups its CPU weight is then its own (lowered by es_nice), not shared
    # with whatever ran `up`
    launcher = launch(
        [str(p["home"] / "bin" / "elasticsearch"), "-d", "-p", str(p["pid"])],
        p["log"],
        {**os.environ, **env},
        p["home"],
        user=s.es_user,
        nice=s.es_nice,
    )
    try:
        returncode = launcher.wait(timeout)
    except subprocess.TimeoutExpired:
        launcher.kill()
        returncode = launcher.wait()
    if returncode != 0:
        stop(s)
        raise InfraError(PART, f"bin/elasticsearch -d exited {returncode}", p["log"])
    log = p["logs"] / "memory-ledger.log"
    healthy_or_stopped(lambda: healthy(s), PART, timeout, log, lambda: pid(s) is not None, lambda: stop(s))


def stop(s: Settings) -> bool:
    return stop_owned(_paths(s)["pid"], MARKER)


def describe(s: Settings) -> dict[str, str]:
    p = _paths(s)
    return {"address": s.es_address, "log": str(p["logs"] / "memory-ledger.log"), "data": str(p["data"])}

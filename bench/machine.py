"""What the numbers were measured on: CPU, cores, RAM, load, and the versions of every server and library."""

from __future__ import annotations

import importlib.util
import os
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psycopg
import typer
from elasticsearch import Elasticsearch
from kafka import KafkaAdminClient

from producers.kafka_producer import kafka_connection
from producers.settings import Settings

__all__ = ["code_version", "cpu_seconds", "load_average", "machine_info", "require_extras"]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def code_version() -> dict[str, Any]:
    """The commit measured, and which files differed from it (the processes run the working tree)."""
    import subprocess

    from producers.settings import REPO_ROOT

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True).stdout.rstrip("\n")

    changed = [line[3:] for line in git("status", "--porcelain").splitlines() if line[3:]]
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "uncommitted_files": changed}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _kafka_version(s: Settings) -> str:
    """The broker's own answer where it gives one, else the configured version infra installed."""
    try:
        admin = KafkaAdminClient(**kafka_connection(s))
        try:
            api = admin._client.check_version()  # noqa: SLF001 - kafka-python exposes the probed API version here
        finally:
            admin.close()
        return f"{s.kafka_version} (broker API {'.'.join(map(str, api))})"
    except Exception:  # noqa: BLE001 - informative only
        return s.kafka_version


def machine_info(s: Settings) -> dict[str, Any]:
    es = Elasticsearch(s.es_url, request_timeout=10)
    try:
        nodes = es.nodes.info(filter_path="nodes.*.version")["nodes"]  # GET / is refused by this build
        es_version = ", ".join(sorted({n["version"] for n in nodes.values()}))
    finally:
        es.close()
    with psycopg.connect(s.pg_dsn) as conn:
        pg_version = conn.execute("SHOW server_version").fetchone()[0]
    libs = ("kafka-python", "faust-streaming", "psycopg", "elasticsearch", "fastembed", "onnxruntime", "fastapi")
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gb": _ram_gb(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "kafka": _kafka_version(s),
        "elasticsearch": es_version,
        "postgresql": pg_version,
        "embedding_model": s.embed_model,
        "libraries": {name: version(name) for name in libs},
    }


# what the `bench` extra brings, by the step that needs it: a run checks them before it starts, not when it
# reaches the plot minutes later
EXTRAS = {"matplotlib": "the plot in BENCHMARKS.md"}


def require_extras(*modules: str) -> None:
    """Exit 2 with one line naming what is missing, before any work, unless every module imports."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        needs = "; ".join(f"{m} ({EXTRAS.get(m, 'needed')})" for m in missing)
        typer.echo(f"bench: missing {needs}: install the bench extra: .venv/bin/pip install -e '.[bench]'", err=True)
        raise typer.Exit(2)

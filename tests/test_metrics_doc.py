"""docs/metrics.md names every metric family the code defines and every recall stage, and nothing else.

A family added in code (a `counter(...)` in a new module) or a stage timed by recall (`trace.timed("x")`) without
a word in the reference would otherwise go unnoticed until an operator looks for it; a name the document still
mentions after its family was renamed or removed sends queries to a series that never comes. The families are
collected from the modules themselves (every module that builds one is imported, and its module-level families
read, the registered and the runner-registered ones alike), the stages from the recall code's `timed` calls.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from producers.metrics import PREFIX
from producers.settings import REPO_ROOT

pytestmark = pytest.mark.unit

DOC = REPO_ROOT / "docs" / "metrics.md"
PACKAGES = ("api", "producers", "stream_processors", "projections")
# how a module builds a family: producers.metrics' constructors, or prometheus-client itself
BUILDS = re.compile(r"from producers\.metrics import|import producers\.metrics|prometheus_client")
# the sample names a family's exposition adds to its name, by type
SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}
# a metric name in the document: `ledger_` and lower case (settings are LEDGER_..., commands `ledger serve`);
# a trailing `_*` names every family with that prefix
DOC_NAME = re.compile(r"\bledger_[a-z0-9_]*[a-z0-9](?:_\*)?")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            if BUILDS.search(path.read_text(encoding="utf-8")):
                parts = path.relative_to(REPO_ROOT).with_suffix("").parts
                names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def families() -> dict[str, str]:
    """Every `ledger_` family the code defines: its exposition name (a counter's with `_total`) -> its type."""
    found: dict[str, str] = {}

    def add(name: str, kind: str) -> None:
        if name.startswith(PREFIX):
            found[name + "_total" if kind == "counter" else name] = kind

    for module in map(importlib.import_module, _modules()):
        for value in vars(module).values():
            # the indexer's and embedder's families are built unregistered (their runners register them)
            for family in value if isinstance(value, tuple) else (value,):
                if isinstance(family, MetricWrapperBase):
                    add(family._name, family._type)
    for collected in REGISTRY.collect():  # anything registered that is not a module-level name
        add(collected.name, collected.type)
    return found


def _literal_stages(arg: ast.expr) -> set[str] | None:
    """The stage names a `timed(...)` argument can be, when the call spells them; None when computed."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, ast.IfExp):
        body, orelse = _literal_stages(arg.body), _literal_stages(arg.orelse)
        return None if body is None or orelse is None else body | orelse
    return None


def recall_stages() -> set[str]:
    """Every stage a recall can time, so every `stage` label of `ledger_recall_stage_duration_seconds`."""
    from projections.search.recall.engine import MODE_TIERS

    stages: set[str] = set()
    computed: set[str] = set()
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr != "timed" or len(node.args) != 1:
                    continue
                literal = _literal_stages(node.args[0])
                if literal is None:
                    computed.add(ast.unparse(node.args[0]))
                else:
                    stages |= literal
    # the two names computed from the tier table: a stage's own name, a tier's verification
    assert computed == {"stage.name", "tier.verify_key"}, f"stage names this test cannot read: {computed}"
    for tiers in MODE_TIERS.values():
        for tier in tiers:
            stages.add(tier.verify_key)
            stages |= {stage.name for stage in tier.stages}
    return stages


def doc_text() -> str:
    return Path(DOC).read_text(encoding="utf-8")


def test_the_code_has_families_and_stages_to_check() -> None:
    """The collection finds what is known to exist, so the tests below cannot pass by finding nothing."""
    found = families()
    assert {"ledger_http_requests_total", "ledger_access_dropped_total", "ledger_embedder_queue_depth"} <= set(found)
    assert {"cues", "exact", "semantic", "verify_fuzzy", "cross_encoder"} <= recall_stages()


def test_every_family_is_in_the_doc() -> None:
    text = doc_text()
    missing = sorted(name for name in families() if f"`{name}`" not in text)
    assert not missing, f"docs/metrics.md does not describe these families: {missing}"


def test_every_recall_stage_is_in_the_doc() -> None:
    text = doc_text()
    missing = sorted(stage for stage in recall_stages() if f"`{stage}`" not in text)
    assert not missing, f"docs/metrics.md does not name these recall stages: {missing}"


def test_every_name_in_the_doc_exists() -> None:
    found = families()
    samples = set(found) | {name + s for name, kind in found.items() for s in SUFFIXES.get(kind, ())}
    stale = set()
    for name in set(DOC_NAME.findall(doc_text())):
        if name.endswith("_*"):
            if not any(s.startswith(name[:-1]) for s in found):
                stale.add(name)
        elif name not in samples:
            stale.add(name)
    assert not stale, f"docs/metrics.md names metrics no code defines: {sorted(stale)}"


def exporters() -> list[str]:
    """The processes that serve metrics: the API (on its own port) and each one with a `*_metrics_port` setting."""
    from producers.settings import Settings

    return ["API_METRICS_PATH"] + [f.upper() for f in Settings.model_fields if f.endswith("_metrics_port")]


def test_every_process_is_in_the_doc_and_counted_right() -> None:
    """The table of addresses has a row per exporter, the scrape configuration a job each, and a count says so."""
    text, settings = doc_text(), exporters()
    table = text.split("## Where each process serves them", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]  # less the header and its rule
    assert len(rows) == len(settings), f"one row per process serving metrics ({settings}): {rows}"
    for setting in settings:
        assert any(f"`LEDGER_{setting}`" in row for row in rows), f"no row of the table names LEDGER_{setting}"
    jobs = re.findall(r"^\s*- job_name:", (REPO_ROOT / "docs" / "prometheus.yml").read_text(encoding="utf-8"), re.M)
    assert len(jobs) == len(settings), "docs/prometheus.yml scrapes one job per process serving metrics"
    numbers = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
    for word in re.findall(r"\b(two|three|four|five|six) processes\b", text, re.I):
        assert numbers[word.lower()] == len(settings), f"docs/metrics.md says {word} processes: {len(settings)} serve"


def test_a_ratio_query_answers_0_without_errors() -> None:
    """A ratio whose numerator selects some series (5xx, a reason) has no data when none exist: `or vector(0)`."""
    fences = re.findall(r"^```promql\n(.*?)^```", doc_text(), re.M | re.S)
    ratios = [line for fence in fences for line in fence.splitlines() if " / " in line and not line.startswith("#")]
    assert ratios, "docs/metrics.md shows an error ratio"
    for line in ratios:
        numerator = line.split(" / ", 1)[0]
        if re.search(r"\{[^}]*=", numerator):
            assert "or vector(0)" in numerator, f"no data instead of 0 when nothing matches: {line}"

"""BENCHMARKS.md and its plot, from one results JSON (every number shown comes from that file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from producers.settings import REPO_ROOT

__all__ = ["latest_results", "write_report"]

RESULTS = REPO_ROOT / "bench" / "results"


def latest_results(directory: Path = RESULTS) -> Path:
    runs = sorted(p for p in directory.glob("2*.json") if "error" not in orjson.loads(p.read_bytes()))
    if not runs:
        raise FileNotFoundError(f"no complete run in {directory}: run `python -m bench run` first")
    return runs[-1]


def _f(v: Any, nd: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def _lag_client(r: dict[str, Any]) -> str:
    """Where the lag step's load and pollers ran: a client process apart at a lower priority, or (older runs)
    inside the bench's own process."""
    nice = (r.get("lag") or {}).get("client_nice")
    if nice is None:
        return ""
    return (
        f" The load and the pollers run as a client process of their own at nice {nice}, its autogroup too "
        "(`bench.lag.measure_lag_apart`): on a host shared with the stack they take what it leaves."
    )


def _lag_rate(lag: dict[str, Any]) -> str:
    return "a rate given to the run" if lag.get("rate_given") else "half the measured end-to-end rate"


def targets(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(target, measured, threshold, verdict) for each benchmark target."""
    out = []
    rl = r.get("recall_latency") or []
    if rl:
        big = rl[-1]
        ex = big["modes"]["exact"]
        out.append(
            (
                f"exact recall over HTTP at {big['fact_versions']:,} fact versions",
                f"p50 {_f(ex['p50_ms'], 2)} ms, p99 {_f(ex['p99_ms'], 2)} ms",
                "p50 <= 4 ms, p99 <= 10 ms",
                _verdict(ex["p50_ms"] <= 4 and ex["p99_ms"] <= 10),
            )
        )
        if "server_ms" in ex:  # the sum of a request's stage times (trace.stages_ms)
            out.append(
                (
                    f"exact recall in the server at {big['fact_versions']:,} fact versions",
                    f"p50 {_f(ex['server_ms']['p50_ms'], 2)} ms",
                    "p50 <= 2 ms",
                    _verdict(ex["server_ms"]["p50_ms"] <= 2),
                )
            )
    e2e = r.get("e2e") or {}
    if "ratio_to_slowest_raw" in e2e:
        out.append(
            (
                f"end-to-end ingest vs slowest raw component ({e2e['slowest_raw']})",
                f"{e2e['ratio_to_slowest_raw']:.2f} x ({_f(e2e['events_per_s'])} events/s)",
                ">= 0.70",
                _verdict(e2e["ratio_to_slowest_raw"] >= 0.7),
            )
        )
    if "es_to_pg_ratio" in e2e:  # two-phase indexing's targets
        out.append(
            (
                "exact/keyword-queryable ingest vs PostgreSQL-visible (same run)",
                f"{e2e['es_to_pg_ratio']:.2f} x ({_f(e2e['events_per_s'])} vs {_f(e2e['pg_events_per_s'])} events/s)",
                ">= 0.50",
                _verdict(e2e["es_to_pg_ratio"] >= 0.5),
            )
        )
    if "pg_to_raw_kafka_ratio" in e2e:
        out.append(
            (
                "PostgreSQL-visible vs raw kafka-python produce (same run)",
                f"{e2e['pg_to_raw_kafka_ratio']:.2f} x ({_f(e2e['pg_events_per_s'])} vs "
                f"{_f(r['raw']['kafka_produce']['per_s'])} events/s)",
                ">= 0.40",
                _verdict(e2e["pg_to_raw_kafka_ratio"] >= 0.4),
            )
        )
    for key, what, unit, bound, at_least in (  # the projection's own targets
        ("pg_events_per_s", "PostgreSQL-visible ingest, the whole stack on this machine", "events/s", 3000, True),
        ("worker_cpu_us_per_event", "the worker's CPU per event, until PostgreSQL holds it", "µs", 150, False),
    ):
        if key in e2e:
            v = e2e[key]
            out.append(
                (
                    what,
                    f"{_f(v)} {unit}",
                    f"{'>=' if at_least else '<='} {bound:,} {unit}",
                    _verdict(v >= bound if at_least else v <= bound),
                )
            )
    for door, ryw in (r.get("ryw") or {}).items():
        out.append(
            (
                f"a write, then a read with its token ({door}, {ryw['pairs']:,} pairs)",
                f"{ryw['misses']} misses, {ryw['not_yet']} not_yet; p99 {_f(ryw['pair_ms']['p99_ms'], 0)} ms",
                "0 misses, p99 <= 1000 ms",
                _verdict(ryw["misses"] == 0 and ryw["not_yet"] == 0 and ryw["pair_ms"]["p99_ms"] <= 1000),
            )
        )
    pub = r.get("publish") or {}
    if "ratio" in pub:  # bench/publish.py: alternating rounds, the median of the per-round ratios
        out.append(
            (
                "SDK publish vs raw kafka-python produce (same run, same events)",
                f"{pub['ratio']:.2f} x ({_f(pub['sdk_per_s'])} vs {_f(pub['raw_per_s'])} events/s; CPU per event "
                f"{_f(pub['sdk_cpu_us_per_event'])} vs {_f(pub['raw_cpu_us_per_event'])} µs)",
                f">= {pub['target']:.2f}",
                _verdict(pub["ratio"] >= pub["target"]),
            )
        )
    if r.get("lag") and "new" in r["lag"]:
        new = r["lag"]["new"]["recall"]
        out.append(
            (
                f"produce -> exact recall of a never-seen entity ({_lag_rate(r['lag'])})",
                f"p99 {_f(new['p99_ms'], 0)} ms",
                "p99 <= 1000 ms",
                _verdict(new["p99_ms"] is not None and new["p99_ms"] <= 1000),
            )
        )
    if r.get("lag") and "vector" in r["lag"]["all"]:
        v = r["lag"]["all"]["vector"]
        out.append(
            (
                "semantic lag (produce -> vectors stored) under the steady load",
                f"p50 {_f(v['p50_ms'], 0)} ms, p99 {_f(v['p99_ms'], 0)} ms",
                "reported, bounded",
                _verdict(v["p99_ms"] is not None and not r["lag"]["all"]["never_seen_vector"]),
            )
        )
    lag = r.get("lag")
    if lag:
        a = lag["all"]
        p99 = max(x for x in (a["pg"]["p99_ms"], a["recall"]["p99_ms"]) if x is not None)
        out.append(
            (
                f"produce -> queryable at {_f(lag['achieved_rate_per_s'])} events/s ({_lag_rate(lag)})",
                f"p99 {_f(p99, 0)} ms (PG {_f(a['pg']['p99_ms'], 0)}, exact recall {_f(a['recall']['p99_ms'], 0)})",
                "p99 <= 1000 ms",
                _verdict(p99 <= 1000 and not a["never_seen_recall"]),
            )
        )
    ev = r.get("eval")
    if ev:
        sr = ev["retrieval"]["self_retrieval"]
        out.append(("self-retrieval Recall@1", _f(sr["recall_at_1"], 3), ">= 0.90", _verdict(sr["recall_at_1"] >= 0.9)))
        out.append(
            ("self-retrieval Recall@10", _f(sr["recall_at_10"], 3), ">= 0.99", _verdict(sr["recall_at_10"] >= 0.99))
        )
        st = ev["storage"]
        da = st["double_active_rate"]
        out.append(("double-active rate", _f(da, 4), "= 0", _verdict(da == 0)))
        out.append(("orphan rate", _f(st["orphan_rate"], 4), "= 0", _verdict(st["orphan_rate"] == 0)))
    return out


def _plot(r: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    raw = r.get("raw") or {}
    names, rates = [], []
    for k, label in (
        ("kafka_produce", "Kafka produce"),
        ("pg_copy", "PG COPY"),
        ("es_bulk", "ES bulk+vectors"),
        ("fastembed", "fastembed"),
    ):
        if k in raw:
            names.append(label)
            rates.append(raw[k]["per_s"])
    e2e = r.get("e2e") or {}
    if e2e:
        names += ["ledger: PG visible", "ledger: PG+ES visible"]
        rates += [e2e["pg_events_per_s"], e2e["events_per_s"]]
    colors = ["#888"] * (len(names) - (2 if e2e else 0)) + (["#4a90d9", "#d9534f"] if e2e else [])
    ax1.barh(names, rates, color=colors)
    ax1.set_xscale("log")
    ax1.set_xlabel("items per second (log)")
    ax1.set_title("raw components vs the ledger end to end")
    for y, v in enumerate(rates):
        ax1.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
    rl = r.get("recall_latency") or []
    modes = ("exact", "keyword", "semantic")
    width = 0.8 / max(1, 2 * len(rl))
    for i, point in enumerate(rl):
        for j, stat in enumerate(("p50_ms", "p99_ms")):
            xs = [m + (2 * i + j) * width for m in range(len(modes))]
            ys = [point["modes"][m][stat] for m in modes]
            ax2.bar(xs, ys, width, label=f"{stat[:3]} @ {point['fact_versions']:,} versions")
    ax2.set_xticks([m + 0.4 - width / 2 for m in range(len(modes))], modes)
    ax2.axhline(4, color="green", lw=0.8, ls="--")
    ax2.axhline(10, color="red", lw=0.8, ls="--")
    ax2.set_ylabel("ms (client side, HTTP)")
    ax2.set_title("recall latency per stage (dashed: exact targets p50 4 / p99 10 ms)")
    ax2.legend(fontsize=7)
    m = r["machine"]
    fig.suptitle(f"{r['started_at'][:19]}Z  {m['cpu_model']}, {m['cores']} cores, {m['ram_gb']} GB", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


KEEP_MARKER = "<!-- bench/report.py rewrites what is above this line and keeps what is below it -->"


def write_report(path: Path, md_path: Path = REPO_ROOT / "BENCHMARKS.md") -> Path:
    """Write the plot beside the JSON and BENCHMARKS.md at the repository root."""
    path = path.resolve()  # named relative to where the command runs; shown relative to the repository
    r = orjson.loads(path.read_bytes())
    png = path.with_suffix(".png")
    _plot(r, png)
    m = r["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Latest run: `{path.relative_to(REPO_ROOT)}` (started {r['started_at'][:19]}Z). Generated by "
        "`python -m bench run` (`bench/report.py`); every number below comes from that file.",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu_model']}, {m['cores']} cores; RAM {m['ram_gb']} GB; {m['os']}; Python {m['python']}",
        f"- Kafka {m['kafka']}, Elasticsearch {m['elasticsearch']}, PostgreSQL {m['postgresql']}",
        f"- embedding model {m['embedding_model']}; " + ", ".join(f"{k} {v}" for k, v in m["libraries"].items()),
        f"- code: commit {r.get('code', {}).get('commit', '?')}"
        + (
            f" with uncommitted {', '.join(r['code']['uncommitted_files'])}"
            if r.get("code", {}).get("uncommitted_files")
            else ""
        ),
        f"- load average (1/5/15 min) at start {r['load_average_start']}, at end {r.get('load_average_end')}: "
        "the servers and this machine were shared with other work, so the numbers are noisy",
        "",
        f"Dataset: {r['dataset']['events']:,} events over {r['dataset']['subjects']:,} subjects "
        f"({', '.join(f'{k} {v:,}' for k, v in r['dataset']['by_type'].items())}).",
        "",
        "## Targets",
        "",
        "| target | measured | threshold | verdict |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in targets(r)],
        "",
        f"![benchmark plot]({png.relative_to(REPO_ROOT)})",
        "",
    ]
    raw = r.get("raw")
    if raw:
        lines += [
            "## Raw components alone (same data)",
            "",
            "| component | items | seconds | items/s |",
            "|---|---|---|---|",
            *[
                f"| {k} | {_f(raw[k]['n'])} {raw[k]['unit']} | {_f(raw[k]['seconds'], 2)} | {_f(raw[k]['per_s'])} |"
                for k in ("kafka_produce", "pg_copy", "fastembed", "es_bulk")
            ],
            "",
        ]
    e2e = r.get("e2e")
    if e2e:
        lines += [
            "## End to end (publish with the SDK -> visible)",
            "",
            "| measure | value |",
            "|---|---|",
            f"| events | {_f(e2e['events'])} ({_f(e2e['fact_versions'])} fact versions in the index) |",
            f"| publish time (SDK, acks=all) | {_f(e2e['publish_s'], 1)} s |",
            f"| visible in PostgreSQL | {_f(e2e['pg_visible_s'], 1)} s = {_f(e2e['pg_events_per_s'])} events/s |",
            f"| visible in PostgreSQL and Elasticsearch (exact, keyword) | {_f(e2e['es_visible_s'], 1)} s = "
            f"{_f(e2e['events_per_s'])} events/s |",
            *(
                [
                    f"| every version with its vectors (semantic; wall time from the first publish) | "
                    f"{_f(e2e['semantic_visible_s'], 1)} s = {_f(e2e['semantic_events_per_s'])} events/s "
                    f"(embed backlog {_f(e2e['embed_backlog_when_es_done'])} when the index had every document) |"
                ]
                if "semantic_visible_s" in e2e
                else []
            ),
            *(
                [f"| the worker's CPU per event, until PostgreSQL held it | {_f(e2e['worker_cpu_us_per_event'])} µs |"]
                if "worker_cpu_us_per_event" in e2e
                else []
            ),
            f"| ratio to the slowest raw component ({e2e.get('slowest_raw')}) "
            f"| {_f(e2e.get('ratio_to_slowest_raw'), 3)} |",
        ]
        if "embedding_bound_events_per_s" in e2e:
            lines.append(
                f"| embedding bound in events/s (one text per fact version) | {_f(e2e['embedding_bound_events_per_s'])}"
                f" events/s; ratio {_f(e2e['ratio_to_embedding_bound'], 3)} |"
            )
        lines += ["", "Phases (each ends with the pipeline caught up; recall latency is measured between them):", ""]
        lines += ["| events | publish s | PG visible s | PG+ES visible s | fact versions after |"]
        lines += ["|---|---|---|---|---|"]
        lines += [
            f"| {_f(p['events'])} | {_f(p['publish_s'], 1)} | {_f(p['pg_visible_s'], 1)} | {_f(p['es_visible_s'], 1)} "
            f"| {_f(p['fact_versions_total'])} |"
            for p in e2e["phases"]
        ]
        lines.append("")
    rl = r.get("recall_latency")
    if rl:
        lines += [
            "## Recall latency over HTTP (client side, one request at a time)",
            "",
            "| fact versions | mode | n | p50 ms | p99 ms | max ms | with hits | server p50 ms "
            "| server median stages (ms) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for point in rl:
            for mode, v in point["modes"].items():
                st = ", ".join(f"{k} {x}" for k, x in v["server_stage_median_ms"].items())
                server = v.get("server_ms", {}).get("p50_ms")
                lines.append(
                    f"| {_f(point['fact_versions'])} | {mode} | {v['n']} | {_f(v['p50_ms'], 2)} | {_f(v['p99_ms'], 2)} "
                    f"| {_f(v['max_ms'], 2)} | {v['with_hits']} | {_f(server, 2)} | {st} |"
                )
        lines.append("")
    lag = r.get("lag")
    if lag:
        lines += [
            "## Produce -> queryable lag",
            "",
            f"Steady load of {_f(lag['achieved_rate_per_s'])} events/s "
            f"(target {_f(lag['target_rate_per_s'])}, {_lag_rate(lag)}) "
            f"for {_f(lag['duration_s'])} s with {lag['probes']} probes.",
            "",
            "| probes | readable in PG p50 / p99 ms | document searchable p50 / p99 ms "
            "| found by exact recall p50 / p99 ms | vectors stored p50 / p99 ms "
            "| never seen (PG / recall / vectors) |",
            "|---|---|---|---|---|---|",
        ]
        empty = {"p50_ms": None, "p99_ms": None}
        for kind in ("all", "update", "new"):
            v = lag[kind]
            vec, doc = v.get("vector") or empty, v.get("doc") or empty  # older results have neither
            lines.append(
                f"| {kind} | {_f(v['pg']['p50_ms'], 0)} / {_f(v['pg']['p99_ms'], 0)} "
                f"| {_f(doc['p50_ms'], 0)} / {_f(doc['p99_ms'], 0)} "
                f"| {_f(v['recall']['p50_ms'], 0)} / "
                f"{_f(v['recall']['p99_ms'], 0)} | {_f(vec['p50_ms'], 0)} / {_f(vec['p99_ms'], 0)} "
                f"| {v['never_seen_pg']} / {v['never_seen_recall']} / {v.get('never_seen_vector', '-')} |"
            )
        lines.append("")
        lines.append(
            "A probe asks by its entity's id, which the exact stage asks of PostgreSQL's current state "
            "(recall.current): a `new` probe (an entity never seen) and an `update` probe are found by exact recall "
            "as soon as PostgreSQL holds them, before their documents are searchable."
        )
        lines.append("")
    if r.get("audit"):
        a = r["audit"]
        lines += [
            "## Audit replay",
            "",
            f"GET /v1/subjects/{a['subject']}/events returning {a['events']:,} events: p50 {_f(a['p50_ms'], 1)} ms, "
            f"p99 {_f(a['p99_ms'], 1)} ms over {a['n']} requests.",
            "",
        ]
    if r.get("rebuild"):
        b = r["rebuild"]
        lines += [
            "## Full rebuild from offset 0",
            "",
            f"{_f(b['records'])} records in {_f(b['seconds'], 1)} s = {_f(b['events_per_s'])} events/s "
            f"(`stream_processors.rebuild.rebuild`, services stopped); checksum equal to the live projection: "
            f"{_f(b['checksum_equal'])}.",
            "",
        ]
    if r.get("eval"):
        from bench.eval import summary_rows

        lines += ["## Quality (`python -m bench eval`, storage and retrieval)", ""]
        lines += ["| layer | metric | value | target |", "|---|---|---|---|"]
        for layer, metric, value, target in summary_rows(r["eval"]):
            lines.append(f"| {layer} | {metric.strip()} | {_f(value, 4)} | {target} |")
        lines.append("")
    if r.get("profiles"):
        lines += ["## Profiles (py-spy, share of samples)", ""]
        for name, prof in r["profiles"].items():
            if not prof:
                continue
            lines += [f"**{name}** ({prof['samples']:,} samples). Top self time: "]
            lines += ["; ".join(f"`{f}` {p}%" for f, p in prof["top_self_pct"][:8]) + ".", ""]
            lines += ["Top inclusive: " + "; ".join(f"`{f}` {p}%" for f, p in prof["top_inclusive_pct"][:8]) + ".", ""]
            ours = prof.get("top_ours_inclusive_pct") or []
            lines += ["Our code, inclusive: " + "; ".join(f"`{f}` {p}%" for f, p in ours[:8]) + ".", ""]
    if r.get("notes"):
        lines += ["## Notes", "", *[f"- {n}" for n in r["notes"]], ""]
    analysis = path.with_suffix(".analysis.md")  # written by a person after reading this run's numbers
    if analysis.exists():
        lines += ["## Analysis of this run", "", analysis.read_text().strip(), ""]
    lines += [
        "## How these numbers are made",
        "",
        "- `python -m bench run [--events 100000 --subjects 10000 --recall-at 10000 --profile]` (needs the `bench` "
        "extra: `pip install -e '.[bench]'`) runs every step on a private topic, schema and index, with the worker, "
        "the indexer and the API as subprocesses, then writes `bench/results/<UTC>.json`, its plot and this file. "
        "`python -m bench report [FILE]` rewrites this file from a results file.",
        "- Raw components: kafka-python produce (acks=all) of the same encoded events; PostgreSQL COPY of the same "
        "events; fastembed on the same text the indexer embeds (statement + key words + aliases); Elasticsearch "
        "bulk of the asserted events with 512-dim vectors (HNSW).",
        "- End to end: publish with the SDK (`send_many`, acks=all) until the stored PostgreSQL positions reach the "
        "topic's end offsets (PG visible) and the search outbox is empty with one document per fact version (ES "
        "visible). The ratio divides events/s by the slowest raw component's items/s; the embedding bound says how "
        "many events/s that component allows, since only assertions are embedded.",
        "- Recall latency: real questions from `bench.dataset.questions_for`, one at a time over HTTP (httpx, "
        "keep-alive), per `mode` (exact, keyword, semantic), 20 warm-up requests each.",
        "- Lag: background events of another tenant at half the measured end-to-end rate; probe events (`update`: a "
        "new value of a known entity's fact; `new`: a never-seen entity) timed from just before publishing until "
        "their version row is in PostgreSQL, and until an exact-mode recall returns that version." + _lag_client(r),
        "- Quality: `python -m bench eval` (`bench/eval.py`), see its docstring for each metric's definition.",
        "",
    ]
    kept = ""  # the sections other benchmarks wrote (encryption, embedding models, ...) stay as they are
    if md_path.exists() and KEEP_MARKER in (text := md_path.read_text()):
        kept = text[text.index(KEEP_MARKER) :]
    md_path.write_text("\n".join(lines) + ("\n" + kept if kept else "\n" + KEEP_MARKER + "\n"))
    return md_path

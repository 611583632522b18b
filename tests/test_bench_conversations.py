"""The dev-set bench's record: its BENCHMARKS.md section says how the API ran and keeps the sections after it."""

from __future__ import annotations

from pathlib import Path

from bench.conversations import SECTION, write_section


def _result(**extra: object) -> dict:
    row = {"n": 1, "any": 1.0, "frac": 1.0, "mrr": 1.0}
    return {"k": 10, "systems": {"ledger:auto": {"all": row}}, "latency": {}, "stages": {}, **extra}


def test_the_section_says_whether_the_api_recorded_accesses(tmp_path: Path) -> None:
    md = tmp_path / "BENCHMARKS.md"
    write_section(md, tmp_path / "c.json", _result(access_recording=False))
    assert "The API recorded no accesses: every question asked the same ledger." in md.read_text()
    write_section(md, tmp_path / "c.json", _result(access_recording=True))
    text = md.read_text()
    assert "The API recorded what it served" in text and "recorded no accesses" not in text
    write_section(md, tmp_path / "c.json", _result())  # --url: the bench cannot see the service's setting
    assert "recorded" not in md.read_text().split(SECTION, 1)[1].split("|", 1)[0]


def test_rewriting_the_section_keeps_the_next_one_apart(tmp_path: Path) -> None:
    md = tmp_path / "BENCHMARKS.md"
    md.write_text(f"# Benchmarks\n\n{SECTION}\n\nold\n\n## Next\n\nkept\n")
    write_section(md, tmp_path / "c.json", _result(access_recording=False))
    text = md.read_text()
    assert "old" not in text and text.endswith("\n\n## Next\n\nkept\n")

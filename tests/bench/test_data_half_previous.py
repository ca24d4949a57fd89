"""bench/data_half.py keeps the previous run's HyMo wall beside each row: read from the section it replaces, whose own
table already holds a previous column (the run's figure is the "HyMo wall s" column, not the second one)."""
from __future__ import annotations

from bench import data_half, report

SECTION = """## Title

Measured 2026-12-07 on commit abc1234, x86_64 with 2 CPUs, load average 2.0, 1.9, 2.4 (1/5/15 min) as it finished.

| stage | HyMo wall s, previous run (0000000, 2026-12-01, load 1.0) | HyMo wall s | HyMo CPU s |
|---|---|---|---|
| quality | 11.6 | 8.3 | 15.7 |
| dedup | 4.8 | 3.2 | 5.4 |

| tool | filter precision |
|---|---|
| HyMo | 0.3744 |
"""


def test_the_previous_column_is_that_runs_own_wall(tmp_path, monkeypatch) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n" + SECTION, encoding="utf-8")
    monkeypatch.setattr(report, "DOC", doc)
    stamp, walls = data_half.previous_hymo_walls("Title")
    assert stamp == "abc1234, 2026-12-07, load 2.0"
    assert walls["quality"] == "8.3" and walls["dedup"] == "3.2"

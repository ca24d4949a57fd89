"""bench/data_half.py --rounds: each side's row is one whole run, the one with the median process wall."""
from __future__ import annotations

from bench import data_half


def run(wall: float) -> dict:
    return {"side": {"wall_s": wall}, "stages": {"dedup": {"wall_s": wall / 20}}}


def test_the_median_run_by_process_wall_is_taken_whole() -> None:
    runs = [run(200.4), run(156.4), run(160.4)]
    assert data_half.median_run(runs) is runs[2]
    assert data_half.median_run(runs[:1]) is runs[0]
    assert data_half.median_run([run(30.0), run(20.0)])["side"]["wall_s"] == 20.0  # the lower middle of an even count

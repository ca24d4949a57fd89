from __future__ import annotations

from flows.cli import main
from tasks.dedup.minhash import candidate_probability, feasible_band_layouts


def test_s_curve_reproduces_the_seed_table(capsys):
    assert main(["plan", "lsh", "--bands", "16", "--rows", "8"]) == 0
    assert capsys.readouterr().out.strip() == "b=16 r= 8 threshold 0.71 | P at s=0.5..0.9: 0.061 0.237 0.613 0.947 1.000"
    assert main(["plan", "lsh", "--seed-table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "b=14 r= 8 threshold 0.72 | P at s=0.5..0.9: 0.053 0.211 0.565 0.924 1.000"
    assert lines[3] == "b= 8 r=16 threshold 0.88 | P at s=0.5..0.9: 0.000 0.002 0.026 0.204 0.806"


def test_feasible_layouts_meet_both_targets_and_the_cheapest_is_named(capsys):
    layouts = feasible_band_layouts(128, 0.85, 0.95, 0.5, 0.05)
    assert layouts and all(p >= 0.95 and q <= 0.05 for _, _, p, q in layouts)
    bands, rows = layouts[0][:2]
    assert all(b * r >= bands * rows for b, r, _, _ in layouts)
    assert candidate_probability(0.85, bands - 1, rows) < 0.95 or candidate_probability(0.5, bands - 1, rows) > 0.05
    assert main(["plan", "lsh", "--hashes", "128"]) == 0
    assert f"fewest hashes: b={bands} r={rows}" in capsys.readouterr().out


def test_infeasible_targets_say_so(capsys):
    assert main(["plan", "lsh", "--hashes", "8", "--catch", "0.55", "--reject", "0.5"]) == 1
    assert "no feasible" in capsys.readouterr().out

"""Paired comparison and the decision rule on numbers whose answers are known."""
from __future__ import annotations

import math

import pytest

from hymo_core.ablate.compare import compare_variant, paired_accuracy, paired_bpb
from hymo_core.ablate.rule import DecisionRule, RuleError


def docs(bits: list[float], n_bytes: list[int], source: str = "s") -> list[dict]:
    return [{"id": f"d{i}", "source": source, "bits": b, "bytes": n, "tokens": n // 4} for i, (b, n) in enumerate(zip(bits, n_bytes))]


def test_bpb_pairs_documents_byte_weighted_with_the_ratio_estimators_error():
    sizes = [100, 200, 300, 400]
    base = {0: docs([400, 800, 1200, 1600], sizes), 1: docs([410, 790, 1210, 1590], sizes)}
    better = {0: docs([300, 600, 900, 1200], sizes), 1: docs([310, 590, 910, 1190], sizes)}
    row = paired_bpb(base, better)
    assert row["n"] == 4 and row["base"] == pytest.approx(4.0) and row["improvement"] == pytest.approx(1.0)
    assert row["per_seed"] == pytest.approx([1.0, 1.0]) and row["seed_sd"] == pytest.approx(0.0)
    # Every document improves by exactly 1 bit per byte: the ratio estimator's residuals vanish.
    assert row["se_items"] == pytest.approx(0.0, abs=1e-12)
    noisy = {0: docs([300, 700, 900, 1300], sizes), 1: docs([310, 690, 910, 1290], sizes)}
    u = [100, 100, 300, 300]  # seed-mean bit gains per document
    estimate = sum(u) / sum(sizes)
    expected = math.sqrt(4 / 3 * sum((g - estimate * b) ** 2 for g, b in zip(u, sizes))) / sum(sizes)
    assert paired_bpb(base, noisy)["se_items"] == pytest.approx(expected)
    # Documents scored in only some runs are left out of every pair.
    partial = {0: better[0][:3], 1: better[1]}
    assert paired_bpb(base, partial)["n"] == 3


def test_accuracy_pairs_items_and_adds_the_seed_spread():
    base = {0: {"a": 0, "b": 1, "c": 0, "d": 1}, 1: {"a": 0, "b": 1, "c": 0, "d": 1}}
    variant = {0: {"a": 1, "b": 1, "c": 1, "d": 1}, 1: {"a": 1, "b": 1, "c": 0, "d": 1}}
    row = paired_accuracy(base, variant)
    assert row["improvement"] == pytest.approx(0.375) and row["per_seed"] == pytest.approx([0.5, 0.25])
    assert row["seed_sd"] == pytest.approx(math.sqrt(((0.5 - 0.375) ** 2 + (0.25 - 0.375) ** 2) / 1))
    assert row["se"] > row["se_items"]
    assert paired_accuracy({0: {}}, {0: {}}) is None


@pytest.mark.parametrize("improvement, se, seeds, verdict", [
    (0.05, 0.01, [0.04, 0.06], "better"),
    (0.05, 0.01, [-0.01, 0.11], "within noise"),  # the mean clears the rule, one seed disagrees
    (-0.05, 0.01, [-0.04, -0.06], "worse"),
    (0.001, 0.002, [0.0, 0.002], "equivalent"),  # the whole interval inside +-min_effect
    (0.02, 0.02, [0.01, 0.03], "within noise"),  # the interval reaches 0
    (0.005, 0.001, [0.004, 0.006], "equivalent"),  # separated from 0, yet all of it smaller than what would matter
])
def test_the_rules_verdicts(improvement, se, seeds, verdict):
    assert DecisionRule(min_effect=0.01, z=2.0).verdict(improvement, se, seeds) == verdict


def test_rule_errors_name_the_spec():
    with pytest.raises(RuleError, match="spec.toml: unknown \\[decision\\] keys"):
        DecisionRule.from_dict({"threshold": 1}, "spec.toml")
    with pytest.raises(RuleError, match="min_effect >= 0 and z > 0"):
        DecisionRule.from_dict({"z": 0}, "spec.toml")


def test_compare_variant_decides_on_the_rules_metric_and_reports_sources():
    sizes = [100, 100, 100, 100]
    base = {s: {"documents": docs([500, 500, 500, 500], sizes, "web") + [dict(d, id="p" + d["id"]) for d in docs([300] * 2, [100] * 2, "prose")],
                "suite": {}} for s in (0, 1)}
    variant = {s: {"documents": docs([450, 440, 460, 450], sizes, "web") + [dict(d, id="p" + d["id"]) for d in docs([300] * 2, [100] * 2, "prose")],
                   "suite": {}} for s in (0, 1)}
    row = compare_variant(DecisionRule(min_effect=0.1), base, variant)
    assert row["verdict"] == "better" and row["suite_accuracy"] is None
    assert row["per_source_bpb"]["web"]["improvement"] == pytest.approx(0.5)
    assert row["per_source_bpb"]["prose"]["improvement"] == pytest.approx(0.0)


def test_t_quantiles_match_the_tables():
    from hymo_core.ablate.student_t import t_cdf, t_quantile

    # Student's t, two-sided 95 %: the printed tables' values at 1, 2, 5 and 30 degrees of freedom; the normal's at infinity.
    for df, expected in ((1, 12.706), (2, 4.303), (5, 2.571), (30, 2.042), (math.inf, 1.960)):
        assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)
    assert t_quantile(0.025, 3) == pytest.approx(-t_quantile(0.975, 3))
    assert t_cdf(t_quantile(0.9, 2.5), 2.5) == pytest.approx(0.9, abs=1e-10)  # fractional df (Welch-Satterthwaite)
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (0.7, 1.0, 2.31, 7.0, 120.0):
        for p in (0.6, 0.95, 0.975, 0.999):
            assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-8)


def test_two_seeds_whose_spread_dominates_get_a_t_interval_not_z():
    # 3.5 se from zero with 2 seeds that agree in sign: z = 1.96 called it settled; t at ~1 df (12.7) does not.
    rule = DecisionRule(min_effect=0.01)
    assert rule.verdict(0.035, 0.01, [0.025, 0.045], df=1.0) == "within noise"
    assert rule.verdict(0.035, 0.01, [0.025, 0.045], df=math.inf) == "better"  # what the old z = 1.96 concluded
    assert DecisionRule(min_effect=0.01, z=1.96).verdict(0.035, 0.01, [0.025, 0.045], df=1.0) == "better"  # a spec's fixed z
    assert rule.multiplier(1.0) == pytest.approx(12.706, abs=1e-3) and rule.multiplier(math.inf) == pytest.approx(1.96, abs=1e-3)
    with pytest.raises(RuleError, match="confidence must lie in"):
        DecisionRule.from_dict({"confidence": 95}, "spec.toml")


def test_degrees_of_freedom_follow_whichever_error_dominates():
    from hymo_core.ablate.compare import effective_df

    assert effective_df(0.0001, 500, 0.01, 2) == pytest.approx(1.0, abs=1e-3)  # the seed spread: seeds - 1
    assert effective_df(0.01, 500, 0.0, 2) == pytest.approx(499)  # no seed spread: the items' n - 1
    assert 1 < effective_df(0.0034, 52, 0.0047, 2) < 51
    assert effective_df(0.0, 10, 0.0, 2) == math.inf


def test_a_verdict_is_stated_with_the_proxies_token_budget_and_judged_on_its_degrees_of_freedom():
    sizes = [100] * 6
    base = {s: {"documents": docs([500] * 6, sizes, "web"), "suite": {}, "train_tokens": 40_960} for s in (0, 1)}
    # Documents gain 0.25 +- 0.05 bits per byte on seed 0 and 0.55 on seed 1: both seeds improve, by amounts that differ.
    variant = {s: {"documents": docs([500 - 100 * g for g in ([0.2, 0.3] * 3 if s == 0 else [0.5, 0.6] * 3)], sizes, "web"),
                   "suite": {}, "train_tokens": 40_960} for s in (0, 1)}
    row = compare_variant(DecisionRule(min_effect=0.01), base, variant)
    bpb = row["heldout_bpb"]
    assert bpb["improvement"] == pytest.approx(0.4) and bpb["per_seed"] == pytest.approx([0.25, 0.55])
    assert bpb["df"] < 1.1 and bpb["multiplier"] > 10  # the seed spread (1 df) dominates the error
    assert 1.96 < bpb["improvement"] / bpb["se"] < bpb["multiplier"]
    assert row["verdict"] == "within noise"  # about 2.6 se: z = 1.96 called this settled
    assert row["statement"] == "within noise at 40,960 training tokens per proxy run"
    more = {s: dict(r, train_tokens=163_840) for s, r in variant.items()}
    assert compare_variant(DecisionRule(min_effect=0.01), base, more)["train_tokens"] == "at 40,960 to 163,840 training tokens per proxy run"

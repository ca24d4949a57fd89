"""The decision rule of an ablation: written in the spec before any proxy trains, the only input to a verdict.

Seed 001: a candidate is chosen by proxy training, and small benchmarks cannot support precise claims,
so a verdict needs an effect larger than a stated minimum *and* separated from the noise. For each
variant the improvement I over the base (base - variant for bits per byte, variant - base for
accuracy) has a standard error that adds the item error and the seed spread (compare.py). With
z, min_effect and every_seed from the spec:

* better:     I - z se > 0, I >= min_effect, and (every_seed) every seed's I > 0
* worse:      I + z se < 0, -I >= min_effect, and (every_seed) every seed's I < 0
* equivalent: the whole interval I +- z se lies inside +-min_effect
* within noise: anything else (the evidence does not separate the variant from the base)
"""
from __future__ import annotations

from dataclasses import dataclass

METRICS = {"heldout_bpb": "lower", "suite_accuracy": "higher"}  # what an ablation can decide on, and which way is good
VERDICTS = ("better", "worse", "equivalent", "within noise")


class RuleError(ValueError):
    """A decision rule that cannot be used (the message names the spec file)."""


@dataclass(frozen=True)
class DecisionRule:
    metric: str = "heldout_bpb"
    min_effect: float = 0.01  # bits per byte (or accuracy as a fraction) that would change a decision
    z: float = 1.96  # interval half-width in standard errors
    every_seed: bool = True  # the sign must hold on every seed's own pair, not only on their mean

    @classmethod
    def from_dict(cls, values: dict, where: str) -> "DecisionRule":
        unknown = set(values) - {"metric", "min_effect", "z", "every_seed"}
        if unknown:
            raise RuleError(f"{where}: unknown [decision] keys {sorted(unknown)}; known: metric, min_effect, z, every_seed")
        rule = cls(**values)
        if rule.metric not in METRICS:
            raise RuleError(f"{where}: [decision] metric {rule.metric!r} is not one of {sorted(METRICS)}")
        if not (rule.min_effect >= 0 and rule.z > 0):
            raise RuleError(f"{where}: [decision] needs min_effect >= 0 and z > 0, got {rule.min_effect} and {rule.z}")
        return rule

    def verdict(self, improvement: float, se: float, per_seed: list[float]) -> str:
        low, high = improvement - self.z * se, improvement + self.z * se
        if low > 0 and improvement >= self.min_effect and (not self.every_seed or all(i > 0 for i in per_seed)):
            return "better"
        if high < 0 and -improvement >= self.min_effect and (not self.every_seed or all(i < 0 for i in per_seed)):
            return "worse"
        if -self.min_effect < low and high < self.min_effect:
            return "equivalent"
        return "within noise"

    def describe(self) -> str:
        good = "lower" if METRICS[self.metric] == "lower" else "higher"
        return (f"{self.metric} ({good} is better): better/worse when the improvement's {self.z:g}-se interval excludes 0, "
                f"|improvement| >= {self.min_effect:g}" + (", and every seed agrees" if self.every_seed else "")
                + f"; equivalent when the interval lies within +-{self.min_effect:g}")

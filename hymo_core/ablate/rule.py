"""The decision rule of an ablation: written in the spec before any proxy trains, the only input to a verdict.

Seed 001: a candidate is chosen by proxy training, and small benchmarks cannot support precise claims,
so a verdict needs an effect larger than a stated minimum *and* separated from the noise. For each
variant the improvement I over the base (base - variant for bits per byte, variant - base for
accuracy) has a standard error that adds the item error and the seed spread (compare.py), with the
Welch-Satterthwaite degrees of freedom of that sum. The interval is I +- k se, where k is Student's
t quantile at the spec's `confidence` (default 0.95, two-sided) and those degrees of freedom: with 2
seeds whose spread dominates, about 1 degree of freedom and k = 12.7, not the normal 1.96 that would
call a two-seed difference settled far too often. A spec may fix k itself with `z` (then it is used
whatever the seeds). With min_effect and every_seed from the spec:

* better:     I - k se > 0, I >= min_effect, and (every_seed) every seed's I > 0
* worse:      I + k se < 0, -I >= min_effect, and (every_seed) every seed's I < 0
* equivalent: the whole interval I +- k se lies inside +-min_effect
* within noise: anything else (the evidence does not separate the variant from the base)

A verdict holds for the proxies' training budget only (compare.py states the tokens with it): the
same variant can flip between 20 and 80 updates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hymo_core.ablate.student_t import t_quantile

METRICS = {"heldout_bpb": "lower", "suite_accuracy": "higher"}  # what an ablation can decide on, and which way is good
VERDICTS = ("better", "worse", "equivalent", "within noise")


class RuleError(ValueError):
    """A decision rule that cannot be used (the message names the spec file)."""


@dataclass(frozen=True)
class DecisionRule:
    metric: str = "heldout_bpb"
    min_effect: float = 0.01  # bits per byte (or accuracy as a fraction) that would change a decision
    confidence: float = 0.95  # two-sided coverage of the interval, through a t quantile (see the module docstring)
    z: float | None = None  # a fixed interval half-width in standard errors instead of the t quantile
    every_seed: bool = True  # the sign must hold on every seed's own pair, not only on their mean

    @classmethod
    def from_dict(cls, values: dict, where: str) -> "DecisionRule":
        unknown = set(values) - {"metric", "min_effect", "confidence", "z", "every_seed"}
        if unknown:
            raise RuleError(f"{where}: unknown [decision] keys {sorted(unknown)}; known: metric, min_effect, confidence, z, every_seed")
        rule = cls(**values)
        if rule.metric not in METRICS:
            raise RuleError(f"{where}: [decision] metric {rule.metric!r} is not one of {sorted(METRICS)}")
        if not (rule.min_effect >= 0 and (rule.z is None or rule.z > 0)):
            raise RuleError(f"{where}: [decision] needs min_effect >= 0 and z > 0, got {rule.min_effect} and {rule.z}")
        if not 0 < rule.confidence < 1:
            raise RuleError(f"{where}: [decision] confidence must lie in (0, 1), got {rule.confidence}")
        return rule

    def multiplier(self, df: float = math.inf) -> float:
        """The interval's half-width in standard errors at `df` degrees of freedom."""
        if self.z is not None:
            return self.z
        return t_quantile(0.5 + self.confidence / 2, df if df > 0 else math.inf)

    def verdict(self, improvement: float, se: float, per_seed: list[float], df: float = math.inf) -> str:
        k = self.multiplier(df)
        low, high = improvement - k * se, improvement + k * se
        if low > 0 and improvement >= self.min_effect and (not self.every_seed or all(i > 0 for i in per_seed)):
            return "better"
        if high < 0 and -improvement >= self.min_effect and (not self.every_seed or all(i < 0 for i in per_seed)):
            return "worse"
        if -self.min_effect < low and high < self.min_effect:
            return "equivalent"
        return "within noise"

    def describe(self) -> str:
        good = "lower" if METRICS[self.metric] == "lower" else "higher"
        interval = (f"{self.z:g}-se interval" if self.z is not None else
                    f"{100 * self.confidence:g} % interval (Student's t at the item and seed errors' Welch-Satterthwaite "
                    "degrees of freedom)")
        return (f"{self.metric} ({good} is better): better/worse when the improvement's {interval} excludes 0, "
                f"|improvement| >= {self.min_effect:g}" + (", and every seed agrees" if self.every_seed else "")
                + f"; equivalent when the interval lies within +-{self.min_effect:g}; a verdict holds at the proxies' token budget")

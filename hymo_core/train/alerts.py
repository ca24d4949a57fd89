"""Alerts that act: a recipe's `[[alerts]]` tables, checked on what the loop logs, each with its action.

Seed 001: "every alert needs an action: check the data, reproduce the numeric
fault, restore a known checkpoint, or check the device". A recipe declares

    [[alerts]]
    name = "loss spike"          # optional; defaults to metric + condition
    metric = "last_loss"         # a number in the train record (dotted for nested: "lr.adamw"), or "val_loss"
    condition = "zscore > 5"     # "> x", "< x", "zscore > x" (against the window), "growth > x" (ratio to the window's
                                 # smallest), "nonfinite", "outside_forecast" (val_loss vs the loss forecast's band)
    window = 20                  # how many earlier values the statistic looks back over
    action = "log"               # log | checkpoint | skip-batch | lower-lr | stop
    factor = 0.5                 # lower-lr: the LR scale is multiplied by this (it persists in checkpoints)

The recipe's tables replace the defaults (`DEFAULT_ALERTS`); `[[alerts]]` with
`metric = "none"` alone switches them all off.

When they are checked. Train and eval records exist on logging and eval steps,
so most alerts cost nothing in between. `skip-batch` has to decide before the
optimizer mutates anything, so an alert with that action is also checked on
every step against the step's loss and gradient norm: that is one host read
of two numbers per step, paid only by recipes that ask for it.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Iterable

ACTIONS = ("log", "checkpoint", "skip-batch", "lower-lr", "stop")
STEP_METRICS = ("last_loss", "grad_norm_pre_clip")  # known before the optimizer step: what skip-batch can judge
CONDITION = re.compile(r"^\s*(?:(?P<kind>zscore|growth)\s*)?(?P<op>[<>])\s*(?P<value>[-+0-9.eE]+)\s*$")


class AlertConfigError(ValueError):
    pass


@dataclass(frozen=True)
class AlertRule:
    metric: str
    condition: str
    action: str = "log"
    window: int = 20
    factor: float = 0.5
    name: str = ""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise AlertConfigError(f"alert {self.label!r}: action must be one of {ACTIONS}, got {self.action!r}")
        if self.condition not in ("nonfinite", "outside_forecast") and not CONDITION.match(self.condition):
            raise AlertConfigError(f"alert {self.label!r}: condition {self.condition!r} is not '> x', '< x', 'zscore > x', "
                                   "'growth > x', 'nonfinite' or 'outside_forecast'")
        if self.window < 2 and self.kind in ("zscore", "growth"):
            raise AlertConfigError(f"alert {self.label!r}: a {self.kind} condition needs window >= 2, got {self.window}")
        if not 0 < self.factor < 1 and self.action == "lower-lr":
            raise AlertConfigError(f"alert {self.label!r}: lower-lr needs 0 < factor < 1, got {self.factor}")
        if self.action == "skip-batch" and self.metric not in STEP_METRICS and self.metric != "nonfinite":
            raise AlertConfigError(f"alert {self.label!r}: skip-batch decides before the update, so its metric must be one of "
                                   f"{STEP_METRICS} or 'nonfinite', got {self.metric!r}")

    @property
    def label(self) -> str:
        return self.name or f"{self.metric} {self.condition}"

    @property
    def kind(self) -> str:
        if self.condition in ("nonfinite", "outside_forecast"):
            return self.condition
        return CONDITION.match(self.condition).group("kind") or "threshold"

    @property
    def threshold(self) -> float | None:
        match = CONDITION.match(self.condition)
        return float(match.group("value")) if match else None

    def metrics(self) -> tuple[str, ...]:
        return STEP_METRICS if self.metric == "nonfinite" else (self.metric,)


DEFAULT_ALERTS = (
    AlertRule("nonfinite", "nonfinite", "stop", window=1, name="non-finite loss or gradient"),
    AlertRule("last_loss", "zscore > 6", "log", window=20, name="loss spike"),
    AlertRule("grad_norm_pre_clip", "zscore > 6", "log", window=20, name="gradient-norm spike"),
    AlertRule("max_attention_logit", "growth > 2", "log", window=10, name="attention-logit growth"),
    AlertRule("max_data_wait_s", "> 30", "checkpoint", window=1, name="stalled loader"),
    AlertRule("val_loss", "outside_forecast", "log", window=1, name="held-out loss outside the forecast band"),
)


def parse_alerts(tables: Iterable[dict[str, Any]] | None, where: str = "recipe") -> tuple[AlertRule, ...]:
    """The recipe's [[alerts]] (None: the defaults). Unknown keys and bad values name the table."""
    if tables is None:
        return DEFAULT_ALERTS
    rules = []
    for number, table in enumerate(tables, 1):
        unknown = sorted(set(table) - {f for f in AlertRule.__dataclass_fields__})
        if unknown:
            raise AlertConfigError(f"{where}: [[alerts]] #{number}: unknown keys {unknown}")
        if table.get("metric") == "none":
            continue
        try:
            rules.append(AlertRule(**table))
        except TypeError as exc:
            raise AlertConfigError(f"{where}: [[alerts]] #{number}: {exc}") from None
        except AlertConfigError as exc:
            raise AlertConfigError(f"{where}: [[alerts]] #{number}: {exc}") from None
    return tuple(rules)


def metric_value(record: dict[str, Any], metric: str) -> float | None:
    value: Any = record
    for part in metric.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, dict):  # e.g. lr per group: the largest
        numbers = [v for v in value.values() if isinstance(v, (int, float))]
        return max(numbers) if numbers else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def fires(rule: AlertRule, value: float, history: list[float], band: tuple[float, float] | None = None) -> tuple[bool, float | None]:
    """(fired, the statistic compared with the threshold) for one new value against earlier ones."""
    kind, threshold = rule.kind, rule.threshold
    if kind == "nonfinite":
        return not math.isfinite(value), value
    if not math.isfinite(value):
        return False, None  # a non-finite value is the nonfinite alert's business
    if kind == "outside_forecast":
        if band is None:
            return False, None
        return not band[0] <= value <= band[1], value
    op = CONDITION.match(rule.condition).group("op")
    if kind == "threshold":
        statistic = value
    else:
        earlier = [v for v in history[-rule.window:] if math.isfinite(v)]
        if len(earlier) < max(2, rule.window // 2):
            return False, None  # too little history for a statistic
        if kind == "zscore":
            mean = sum(earlier) / len(earlier)
            spread = (sum((v - mean) ** 2 for v in earlier) / (len(earlier) - 1)) ** 0.5
            statistic = (value - mean) / max(spread, 1e-12 * max(abs(mean), 1.0))
        else:  # growth: ratio to the window's smallest
            low = min(earlier)
            statistic = value / low if low > 0 else None
            if statistic is None:
                return False, None
    return (statistic > threshold) if op == ">" else (statistic < threshold), statistic


@dataclass
class Firing:
    step: int
    alert: str
    metric: str
    value: float | None
    statistic: float | None
    condition: str
    action: str

    def to_record(self) -> dict[str, Any]:
        row = asdict(self)
        for key in ("value", "statistic"):  # JSON has no NaN / inf
            if row[key] is not None and not math.isfinite(row[key]):
                row[key] = str(row[key])
        return {"kind": "alert", **row}


class AlertBook:
    """The rules, the history each metric's statistic reads, and what fired."""

    def __init__(self, rules: Iterable[AlertRule] = DEFAULT_ALERTS):
        self.rules = tuple(rules)
        self.history: dict[str, list[float]] = {}
        self.fired: list[Firing] = []
        self.evals: list[tuple[float, float]] = []  # (tokens seen, held-out loss) of every eval so far

    @property
    def checks_every_step(self) -> bool:
        return any(r.action == "skip-batch" for r in self.rules)

    def check_step(self, step: int, loss: float, grad_norm: float) -> Firing | None:
        """Before the optimizer step (only when a skip-batch rule exists): the first skip-batch rule that fires."""
        values = {"last_loss": loss, "grad_norm_pre_clip": grad_norm}
        for rule in self.rules:
            if rule.action != "skip-batch":
                continue
            for metric in rule.metrics():
                fired, statistic = fires(rule, values[metric], self.history.get(f"step:{metric}", []))
                if fired:
                    return self._fire(rule, step, metric, values[metric], statistic)
        for metric, value in values.items():  # a skipped batch's values do not enter the history
            if math.isfinite(value):
                self.history.setdefault(f"step:{metric}", []).append(value)
        return None

    def forecast_band(self, record: dict[str, Any]) -> tuple[float, float] | None:
        """Where this eval's held-out loss was expected, from the earlier evals' fit (forecast.py); None too early."""
        if "val_loss" not in record or not record.get("tokens_seen"):
            return None
        from hymo_core.train.forecast import observed_band

        points = self.evals
        self.evals = points + [(float(record["tokens_seen"]), float(record["val_loss"]))]
        if not any(r.kind == "outside_forecast" for r in self.rules):
            return None
        return observed_band([t for t, _ in points], [v for _, v in points], float(record["tokens_seen"]))

    def check_record(self, record: dict[str, Any]) -> list[Firing]:
        """A train or eval record: every non-skip rule whose metric it carries; the history then grows."""
        step = int(record.get("step", 0))
        band = self.forecast_band(record)
        firings = []
        seen: dict[str, float] = {}
        for rule in self.rules:
            if rule.action == "skip-batch":
                continue
            for metric in rule.metrics():
                value = metric_value(record, metric)
                if value is None:
                    continue
                seen[metric] = value
                fired, statistic = fires(rule, value, self.history.get(metric, []), band if metric == "val_loss" else None)
                if fired:
                    firings.append(self._fire(rule, step, metric, value, statistic))
        for metric, value in seen.items():
            self.history.setdefault(metric, []).append(value)
        return firings

    def _fire(self, rule: AlertRule, step: int, metric: str, value: float, statistic: float | None) -> Firing:
        firing = Firing(step, rule.label, metric, value, statistic, rule.condition, rule.action)
        self.fired.append(firing)
        return firing

    def factor_of(self, firing: Firing) -> float:
        return next(r.factor for r in self.rules if r.label == firing.alert)

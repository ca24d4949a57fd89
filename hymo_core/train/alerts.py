"""Alerts that act: a recipe's `[[alerts]]` tables, checked on what the loop logs, each with its action.

Seed 001: "every alert needs an action: check the data, reproduce the numeric
fault, restore a known checkpoint, or check the device". A recipe declares

    [[alerts]]
    name = "loss spike"          # optional; defaults to metric + condition
    metric = "last_loss"         # a number in the train record (dotted for nested: "lr.adamw"), or "val_loss"
    condition = "zscore > 5"     # "> x", "< x", "zscore > x" (robust: median / MAD of the window), "growth > x" (ratio to
                                 # the window's smallest), "nonfinite", "outside_forecast" (val_loss vs the forecast's band)
                                 # x: a number or a run constant, "0.5 * tau", "ln_vocab + 1" (RUN_CONSTANTS)
    window = 20                  # how many earlier values the statistic looks back over
    action = "log"               # log | checkpoint | skip-batch | lower-lr | stop
    factor = 0.5                 # lower-lr: the LR scale is multiplied by this (it persists in checkpoints)
    spread_floor = 0.05          # zscore: the robust spread is at least this fraction of the window's median

The recipe's tables replace the defaults (`DEFAULT_ALERTS`); `[[alerts]]` with
`metric = "none"` alone switches them all off.

Why the defaults are what they are (docs/training.md, "Watching a run"). Seed
001's Lab 3 measured the max attention logit at 28 on a healthy run and
970-2,630 on unstable ones, with QK-Clip's tau = 100: a magnitude against a
fraction of tau separates them, a ratio to a small early value does not (the
sample starts near 0.3, so any healthy run "doubles" it). A freshly
initialised model predicts close to uniform, loss = ln V (within 0.05 nats on
nine initialisations of three shapes); a loss 0.5 nats above ln V means
training made the model worse than guessing, and log-Z (the softmax normaliser)
stays within about 1 nat of ln V in every Lab 3 run, healthy or not, while a
blow-up drives it far past. The spike rules use the median and MAD of the
window, which two earlier logs already define, so they watch a run from its
third log instead of its eleventh.

Quiet when healthy (issue 58). Two outcomes are information, not warnings:
a held-out loss *below* the forecast band (better than expected: the forecast
alert is one-sided, and a below-band evaluation is a `note`), and a spike that
recovers. A `log`-action z-score rule that fires is held until the metric's
next log: if that value is no spike, the firing becomes a note ("recovered");
if it is one too, both are warnings; a run that ends first warns. Rules whose
action does something (checkpoint, lower-lr, stop, skip-batch) act at once.
Warnings are `kind: "alert"` rows, notes `kind: "note"` rows; bench/alert_rates.py
counts both on healthy sample runs of 200, 400 and 1,000 updates.

Restarts. `AlertBook.state_dict()` (the history each statistic reads, the
evaluations the forecast fits, what fired) goes into every checkpoint, so a
resumed run judges each value against the same past as an uninterrupted one.

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
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# "> 3", "> 0.5 * tau", "> ln_vocab + 1": a number, or a run constant with an optional factor and offset
CONDITION = re.compile(rf"^\s*(?:(?P<kind>zscore|growth)\s*)?(?P<op>[<>])\s*(?:(?P<value>{NUMBER})|(?:(?P<factor>{NUMBER})\s*\*\s*)?"
                       rf"(?P<name>[a-z_]+)(?:\s*(?P<sign>[-+])\s*(?P<offset>{NUMBER}))?)\s*$")
# What a threshold may name: set from the run (AlertBook(constants=...)); the trainer passes both.
RUN_CONSTANTS = ("ln_vocab", "tau")  # ln of the vocabulary size (a uniform prediction's loss); QK-Clip's threshold
MIN_HISTORY = 2  # earlier values a robust statistic needs: a spike is judged from the third log on
RELATIVE_SCALE_FLOOR = 0.05  # the robust spread is at least 5 % of the median: a flat series's jitter is no spike
MAD_TO_SIGMA = 1.4826  # MAD x this estimates a normal distribution's standard deviation
# outside_forecast judges every evaluation: a 90 % band would flag one healthy evaluation in ten, so the alert reads the
# 99 % band (one in a hundred by chance; tests/hymo_core/train/test_forecast.py counts both on healthy runs)
FORECAST_ALERT_LEVEL = 0.99


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
    spread_floor: float = RELATIVE_SCALE_FLOOR  # zscore: the spread is at least this fraction of |median|


    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise AlertConfigError(f"alert {self.label!r}: action must be one of {ACTIONS}, got {self.action!r}")
        match = CONDITION.match(self.condition)
        if self.condition not in ("nonfinite", "outside_forecast") and not match:
            raise AlertConfigError(f"alert {self.label!r}: condition {self.condition!r} is not '> x', '< x', 'zscore > x', "
                                   "'growth > x', 'nonfinite' or 'outside_forecast'")
        if match and match.group("name") and match.group("name") not in RUN_CONSTANTS:
            raise AlertConfigError(f"alert {self.label!r}: condition {self.condition!r} names {match.group('name')!r}; "
                                   f"a threshold may name {', '.join(RUN_CONSTANTS)}")
        if self.window < 2 and self.kind in ("zscore", "growth"):
            raise AlertConfigError(f"alert {self.label!r}: a {self.kind} condition needs window >= 2, got {self.window}")
        if not 0 <= self.spread_floor <= 10:
            raise AlertConfigError(f"alert {self.label!r}: spread_floor is a fraction of the median, 0 to 10, got {self.spread_floor}")
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
        """The number compared with; None when the condition names a run constant (`threshold_in`)."""
        match = CONDITION.match(self.condition)
        return float(match.group("value")) if match and match.group("value") else None

    def threshold_in(self, constants: dict[str, float]) -> float | None:
        """The threshold with run constants filled in; None when the run does not know the one it names."""
        match = CONDITION.match(self.condition)
        if not match:
            return None
        if match.group("value"):
            return float(match.group("value"))
        base = constants.get(match.group("name"))
        if base is None:
            return None
        offset = float(match.group("offset") or 0.0) * (-1.0 if match.group("sign") == "-" else 1.0)
        return float(match.group("factor") or 1.0) * base + offset

    def metrics(self) -> tuple[str, ...]:
        return STEP_METRICS if self.metric == "nonfinite" else (self.metric,)


DEFAULT_ALERTS = (
    AlertRule("nonfinite", "nonfinite", "stop", window=1, name="non-finite loss or gradient"),
    AlertRule("last_loss", "> ln_vocab + 0.5", "log", window=1, name="loss above ln V"),
    AlertRule("log_z", "> ln_vocab + 3", "log", window=1, name="log-Z far above ln V"),
    AlertRule("max_attention_logit", "> 0.5 * tau", "log", window=1, name="attention logits near QK-Clip's tau"),
    AlertRule("last_loss", "zscore > 6", "log", window=20, name="loss spike"),
    # A healthy run's gradient norm drifts by tens of percent within 20 logs, and the window's median lags the drift: at
    # the 5 % floor the sample's healthy 1,000-update run reached z = 5.9 at step 480 (1.48 against a window median of 0.97),
    # a hair from warning. A quarter of the median as the least spread makes the rule ask for about 2.5x the recent
    # median: that run's largest healthy statistic is then 2.1, and the sample's transient spike at step 80 (3.7-4.7
    # against about 1.3) still fires at 7.2-10 (bench/alert_rates.py prints both).
    AlertRule("grad_norm_pre_clip", "zscore > 6", "log", window=20, name="gradient-norm spike", spread_floor=0.25),
    AlertRule("max_data_wait_s", "> 30", "checkpoint", window=1, name="stalled loader"),
    AlertRule("val_loss", "outside_forecast", "log", window=1, name="held-out loss above the forecast band"),
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


def robust_zscore(value: float, earlier: list[float], floor: float = RELATIVE_SCALE_FLOOR) -> float:
    """(value - median) / (1.4826 MAD), the spread floored at `floor` x |median|: one outlier in the window
    moves neither, so a spike does not hide the next one, and two values already define both."""
    ordered = sorted(earlier)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])
    deviations = sorted(abs(v - median) for v in ordered)
    mad = deviations[middle] if len(deviations) % 2 else 0.5 * (deviations[middle - 1] + deviations[middle])
    spread = max(MAD_TO_SIGMA * mad, floor * abs(median), 1e-12)
    return (value - median) / spread


def fires(rule: AlertRule, value: float, history: list[float], band: tuple[float, float] | None = None,
          constants: dict[str, float] | None = None) -> tuple[bool, float | None]:
    """(fired, the statistic compared with the threshold) for one new value against earlier ones."""
    kind, threshold = rule.kind, rule.threshold_in(constants or {})
    if kind == "nonfinite":
        return not math.isfinite(value), value
    if not math.isfinite(value):
        return False, None  # a non-finite value is the nonfinite alert's business
    if kind == "outside_forecast":  # one-sided: above the band is trouble, below it good news (check_record notes it)
        if band is None:
            return False, None
        return value > band[1], value
    if threshold is None:
        return False, None  # names a constant this run does not have (e.g. tau without a model vocabulary)
    op = CONDITION.match(rule.condition).group("op")
    if kind == "threshold":
        statistic = value
    else:
        earlier = [v for v in history[-rule.window:] if math.isfinite(v)]
        if len(earlier) < MIN_HISTORY:
            return False, None  # too little history for a statistic
        if kind == "zscore":
            statistic = robust_zscore(value, earlier, rule.spread_floor)
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
    severity: str = "warning"  # "warning": a kind "alert" row; "info": a kind "note" row (no action taken)
    note: str = ""  # why it is information, or how a held spike was judged
    judged_at: int | None = None  # a held spike: the step whose log judged it (a resume drops rows past its step by this)

    def to_record(self) -> dict[str, Any]:
        row = asdict(self)
        for key in ("value", "statistic"):  # JSON has no NaN / inf
            if row[key] is not None and not math.isfinite(row[key]):
                row[key] = str(row[key])
        severity, note, judged_at = row.pop("severity"), row.pop("note"), row.pop("judged_at")
        return {"kind": "alert" if severity == "warning" else "note", **row, **({"note": note} if note else {}),
                **({"judged_at": judged_at} if judged_at is not None else {})}

    @classmethod
    def from_record(cls, row: dict[str, Any]) -> "Firing":
        values = {k: row[k] for k in ("step", "alert", "metric", "value", "statistic", "condition", "action")}
        for key in ("value", "statistic"):
            if isinstance(values[key], str):  # "nan" / "inf" as to_record wrote them
                values[key] = float(values[key])
        severity = "info" if row.get("kind") == "note" or row.get("severity") == "info" else "warning"
        judged_at = row.get("judged_at")
        return cls(**values, severity=severity, note=str(row.get("note", "")), judged_at=None if judged_at is None else int(judged_at))


class AlertBook:
    """The rules, the history each metric's statistic reads, and what fired.

    `constants`: the run's values a threshold may name (RUN_CONSTANTS): ln_vocab, tau.
    The history holds finite values only, the last `history_length` per metric (the
    longest window among the rules), and only of metrics a zscore or growth rule reads:
    all any statistic needs, and all a checkpoint keeps (a clock reading such as
    max_data_wait_s, judged against a fixed threshold, stays out, so equal runs write
    equal checkpoint bytes).
    """

    def __init__(self, rules: Iterable[AlertRule] = DEFAULT_ALERTS, constants: dict[str, float] | None = None):
        self.rules = tuple(rules)
        self.constants = dict(constants or {})
        self.history: dict[str, list[float]] = {}
        self.fired: list[Firing] = []
        self.evals: list[tuple[float, float]] = []  # (tokens seen, held-out loss) of every eval so far
        self.held: dict[str, Firing] = {}  # "label|metric" -> a log-action spike waiting for the metric's next log
        remembering = [r for r in self.rules if r.kind in ("zscore", "growth")]
        self.history_length = max([r.window for r in remembering] + [1])
        self.remembered = {("step:" if r.action == "skip-batch" else "") + m for r in remembering for m in r.metrics()}

    @property
    def checks_every_step(self) -> bool:
        return any(r.action == "skip-batch" for r in self.rules)

    def _remember(self, key: str, value: float) -> None:
        if key in self.remembered and math.isfinite(value):
            kept = self.history.setdefault(key, [])
            kept.append(float(value))
            del kept[:-self.history_length]

    def check_step(self, step: int, loss: float, grad_norm: float) -> Firing | None:
        """Before the optimizer step (only when a skip-batch rule exists): the first skip-batch rule that fires."""
        values = {"last_loss": loss, "grad_norm_pre_clip": grad_norm}
        for rule in self.rules:
            if rule.action != "skip-batch":
                continue
            for metric in rule.metrics():
                fired, statistic = fires(rule, values[metric], self.history.get(f"step:{metric}", []), constants=self.constants)
                if fired:
                    return self._fire(rule, step, metric, values[metric], statistic)
        for metric, value in values.items():  # a skipped batch's values do not enter the history
            self._remember(f"step:{metric}", value)
        return None

    def forecast_band(self, record: dict[str, Any]) -> tuple[float, float] | None:
        """Where this eval's held-out loss was expected, from the earlier evals' fit (forecast.py); None too early."""
        if "val_loss" not in record or not record.get("tokens_seen"):
            return None
        from hymo_core.train.forecast import observed_band

        points = self.evals
        if math.isfinite(float(record["val_loss"])):
            self.evals = points + [(float(record["tokens_seen"]), float(record["val_loss"]))]
        if not any(r.kind == "outside_forecast" for r in self.rules):
            return None
        return observed_band([t for t, _ in points], [v for _, v in points], float(record["tokens_seen"]), level=FORECAST_ALERT_LEVEL)

    def check_record(self, record: dict[str, Any], step: int | None = None) -> list[Firing]:
        """A train or eval record: every non-skip rule whose metric it carries; the history then grows.
        `step`: where the record belongs when it carries no "step" of its own (an eval record)."""
        step = int(record.get("step", 0) if step is None else step)
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
                fired, statistic = fires(rule, value, self.history.get(metric, []), band if metric == "val_loss" else None,
                                         self.constants)
                firings += self._judge(rule, step, metric, value, statistic, fired, band)
        for metric, value in seen.items():
            self._remember(metric, value)
        return firings

    def _judge(self, rule: AlertRule, step: int, metric: str, value: float, statistic: float | None, fired: bool,
               band: tuple[float, float] | None) -> list[Firing]:
        """What one rule's verdict on one value emits: warnings, notes, or nothing yet (a spike held for its next log)."""
        key = f"{rule.label}|{metric}"
        held = self.held.pop(key, None)
        if held is not None and not math.isfinite(value):  # no verdict on recovery: the nonfinite rule speaks for this value
            self.held[key] = held
            return []
        if rule.kind == "outside_forecast" and not fired and band is not None and math.isfinite(value) and value < band[0]:
            return [self._fire(rule, step, metric, value, value, "info",
                               f"below the forecast band [{band[0]:.4f}, {band[1]:.4f}]: better than forecast")]
        if not (rule.kind == "zscore" and rule.action == "log"):
            return [self._fire(rule, step, metric, value, statistic)] if fired else []
        if held is None:
            if fired:  # a spike: judged at the metric's next log
                self.held[key] = Firing(step, rule.label, metric, value, statistic, rule.condition, rule.action)
            return []
        if not fired:
            held.severity, held.note, held.judged_at = "info", f"recovered by step {step} ({metric} = {value:.4g})", step
            self.fired.append(held)
            return [held]
        held.note, held.judged_at = f"not recovered by step {step} ({metric} = {value:.4g})", step
        self.fired.append(held)
        return [held, self._fire(rule, step, metric, value, statistic)]

    def unresolved(self, step: int) -> list[Firing]:
        """At the end of a run (`step`): spikes still held (no later log to show a recovery) are warnings."""
        firings = []
        for firing in self.held.values():
            firing.note, firing.judged_at = "no later log to judge a recovery", step
            self.fired.append(firing)
            firings.append(firing)
        self.held = {}
        return firings

    def fire_nonfinite(self, step: int, metric: str, value: float) -> Firing | None:
        """The loop found a non-finite value it cannot go on from (no skip-batch took it): the nonfinite rule's row, if any."""
        rule = next((r for r in self.rules if r.kind == "nonfinite" and r.action != "skip-batch"), None)
        return None if rule is None else self._fire(rule, step, metric, value, value)

    def _fire(self, rule: AlertRule, step: int, metric: str, value: float, statistic: float | None, severity: str = "warning",
              note: str = "") -> Firing:
        firing = Firing(step, rule.label, metric, value, statistic, rule.condition, rule.action, severity, note)
        self.fired.append(firing)
        return firing

    def factor_of(self, firing: Firing) -> float:
        return next(r.factor for r in self.rules if r.label == firing.alert)

    # ---- checkpointed (the trainer checkpoint's "monitor" entry): plain JSON types, weights_only-loadable

    def state_dict(self) -> dict[str, Any]:
        return {"history": {k: list(v) for k, v in self.history.items()},
                "evals": [[t, v] for t, v in self.evals],
                "fired": [{**{k: v for k, v in f.to_record().items() if k != "kind"}, "severity": f.severity} for f in self.fired],
                "held": {key: {k: v for k, v in f.to_record().items() if k != "kind"} for key, f in self.held.items()}}

    def load_state_dict(self, state: dict[str, Any], where: str = "checkpoint") -> None:
        """Validated first, then applied: a malformed entry raises ValueError naming `where` and leaves the book as it was."""
        try:
            history = {str(k): [float(x) for x in v][-self.history_length:] for k, v in state["history"].items()}
            evals = [(float(t), float(v)) for t, v in state["evals"]]
            fired = [Firing.from_record(row) for row in state["fired"]]
            held = {str(key): Firing.from_record(row) for key, row in state.get("held", {}).items()}  # absent before issue 58
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where}: monitor.alerts is malformed ({type(exc).__name__}: {exc})") from None
        self.history, self.evals, self.fired, self.held = history, evals, fired, held

"""The run's own loss forecast: L(D) = L_inf + a * D^-gamma, fitted robustly, with a bootstrap band.

Seed 001 ("预测运行自身分布的损失"): with the same tokenizer and data, a run's
held-out loss against tokens seen, D, follows L(D) = L_inf + a D^-gamma. Fit it
during training, look at the residuals, and show how the forecast moves with
the fit window: early points constrain the asymptote poorly.

The fit. For a fixed gamma the model is linear in (L_inf, a), so gamma is
searched on a grid and, for each, (L_inf, a) come from iteratively reweighted
least squares with Huber weights (a spike or a restart bump does not drag the
curve); the gamma with the smallest Huber loss wins, refined once on a finer
grid around it. a >= 0 (loss falls), L_inf >= 0.

The band comes from the residuals (a residual bootstrap, seeded): each sample
adds resampled residuals to the fitted curve, refits, and forecasts the target
plus one more resampled residual, so the spread holds both the curve's
uncertainty and the scatter of one observation. The residuals are inflated by
sqrt(n / (n - 3)) for the three fitted parameters: with n = 4 a fit through
the points leaves residuals near zero, which is exactly what must not look
like certainty. The 90 % band is the fit's forecast +- Student's t(0.95, n - 3)
times that spread: percentiles of a bootstrap on 6-10 points cover an
extrapolation too rarely (73-82 % for a nominal 90 % on the test's noisy power
laws), the t quantile pays for estimating the spread from so few residuals.

When there is no forecast. Fewer than MIN_FORECAST_POINTS (6) evaluations:
three parameters leave fewer than three degrees of freedom for the residuals.
A target at or before the last evaluation: that is an observation, not a
forecast. `forecast_if_due` says None in both cases. The band's coverage is
checked on the held-out tail of longer runs (tests/hymo_core/train/test_forecast.py
on noisy power laws; bench/loss_forecast.py on the sample).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

GAMMA_GRID = np.geomspace(0.02, 2.0, 60)
HUBER_DELTA = 1.345  # in units of the residuals' robust scale (MAD): 95 % efficiency under Gaussian noise
MIN_POINTS = 4  # a fit needs this many distinct points (three parameters and one residual)
MIN_FORECAST_POINTS = 6  # a forecast or a band needs this many evaluations
PARAMETERS = 3  # L_inf, a, gamma


@dataclass(frozen=True)
class PowerLaw:
    l_inf: float
    a: float
    gamma: float

    def __call__(self, tokens: np.ndarray | float) -> np.ndarray | float:
        return self.l_inf + self.a * np.power(np.asarray(tokens, dtype=np.float64), -self.gamma)


def _robust_scale(residuals: np.ndarray) -> float:
    mad = float(np.median(np.abs(residuals - np.median(residuals)))) * 1.4826
    return mad if mad > 0 else float(np.std(residuals)) or 1e-6


def _fit_gammas(x: np.ndarray, y: np.ndarray, gammas: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(l_inf, a, Huber loss) for every gamma at once: IRLS on the closed-form two-parameter weighted least squares,
    with the constraints a >= 0 (a flat fit instead) and l_inf >= 0 (a alone through 0)."""
    basis = np.power(x[None, :], -gammas[:, None])  # G x N
    weights = np.ones_like(basis)
    for _ in range(8):
        sw, sb, sy = weights.sum(1), (weights * basis).sum(1), (weights * y).sum(1)
        sbb, sby = (weights * basis * basis).sum(1), (weights * basis * y).sum(1)
        det = np.maximum(sw * sbb - sb * sb, 1e-300)
        a = (sw * sby - sb * sy) / det
        c = (sy - a * sb) / sw
        flat = a < 0
        a, c = np.where(flat, 0.0, a), np.where(flat, sy / sw, c)
        through_zero = c < 0
        a, c = np.where(through_zero, np.maximum(sby / np.maximum(sbb, 1e-300), 0.0), a), np.where(through_zero, 0.0, c)
        residuals = y - (c[:, None] + a[:, None] * basis)
        scale = _robust_scales(residuals)
        r = np.abs(residuals) / scale[:, None]
        weights = np.where(r <= HUBER_DELTA, 1.0, HUBER_DELTA / np.maximum(r, 1e-12))
    loss = np.sum(np.where(r <= HUBER_DELTA, 0.5 * r**2, HUBER_DELTA * r - 0.5 * HUBER_DELTA**2), axis=1) * scale**2
    return c, a, loss


def _robust_scales(residuals_GN: np.ndarray) -> np.ndarray:
    mad = np.median(np.abs(residuals_GN - np.median(residuals_GN, axis=1, keepdims=True)), axis=1) * 1.4826
    return np.where(mad > 0, mad, np.maximum(residuals_GN.std(axis=1), 1e-9))


def fit_power_law(tokens: Sequence[float], losses: Sequence[float]) -> PowerLaw:
    """The robust fit; D is rescaled by its largest value inside the fit (a is reported for raw D)."""
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[keep], y[keep]
    if len(x) < MIN_POINTS:
        raise ValueError(f"a loss forecast needs >= {MIN_POINTS} finite points with D > 0, got {len(x)}")
    unit = float(x.max())
    xs = x / unit
    c, a, loss = _fit_gammas(xs, y, GAMMA_GRID)
    best = GAMMA_GRID[int(np.argmin(loss))]
    fine = np.geomspace(best / 1.08, best * 1.08, 9)
    c, a, loss = _fit_gammas(xs, y, fine)
    i = int(np.argmin(loss))
    return PowerLaw(float(c[i]), float(a[i]) * unit ** float(fine[i]), float(fine[i]))


@dataclass
class Forecast:
    target_tokens: float
    fit: PowerLaw
    forecast: float
    low: float  # 5th percentile of the bootstrap forecasts
    high: float  # 95th percentile
    points: int
    residuals: list[float]
    window_sensitivity: list[dict[str, float]] = field(default_factory=list)  # fit on the last k points -> forecast

    def band_at(self, tokens: float, samples: "BootstrapFits") -> tuple[float, float]:
        return samples.band(tokens)

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["fit"] = asdict(self.fit)
        return row


@dataclass
class BootstrapFits:
    base: PowerLaw  # the fit to the points themselves
    fits: list[PowerLaw]  # refits on the fitted curve plus resampled residuals
    noise: np.ndarray  # per fit, one more resampled residual: the scatter of the observation being forecast
    dof: int  # points - PARAMETERS

    def band(self, tokens: float, level: float = 0.90) -> tuple[float, float]:
        """Where one observation at `tokens` is expected: the fit's forecast +- t(dof) x the spread of (refit's forecast +
        a resampled residual). Student's t, not the normal: the spread is itself estimated from a handful of residuals."""
        values = np.array([f(tokens) for f in self.fits]) + self.noise
        half = student_t_quantile(0.5 + level / 2, self.dof) * float(np.std(values, ddof=1))
        centre = float(self.base(tokens))
        return centre - half, centre + half


def student_t_quantile(probability: float, dof: int) -> float:
    """Student's t quantile (0.5 < probability < 1): the CDF by Simpson's rule on the density, inverted by bisection
    (to ~1e-9; no scipy dependency for one number)."""
    import math

    log_norm = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)

    def cdf(t: float) -> float:
        grid = np.linspace(0.0, t, 2001)
        density = np.exp(log_norm - (dof + 1) / 2 * np.log1p(grid**2 / dof))
        h = grid[1] - grid[0]
        return 0.5 + h / 3 * (density[0] + density[-1] + 4 * density[1:-1:2].sum() + 2 * density[2:-1:2].sum())

    low, high = 0.0, 1.0
    while cdf(high) < probability:
        high *= 2
    for _ in range(60):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if cdf(middle) < probability else (low, middle)
    return 0.5 * (low + high)


def bootstrap(tokens: Sequence[float], losses: Sequence[float], samples: int = 200, seed: int = 0) -> BootstrapFits:
    """The residual bootstrap (module docstring); needs MIN_FORECAST_POINTS points."""
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if len(x) < MIN_FORECAST_POINTS:
        raise ValueError(f"a forecast band needs >= {MIN_FORECAST_POINTS} evaluations, got {len(x)}")
    base = fit_power_law(x, y)
    fitted = base(x)
    residuals = (y - fitted) * np.sqrt(len(x) / (len(x) - PARAMETERS))
    residuals = residuals - np.median(residuals)  # centred: the curve, not an offset, carries the level
    generator = np.random.default_rng(seed)
    fits, noise = [], []
    for _ in range(samples):
        fits.append(fit_power_law(x, fitted + residuals[generator.integers(0, len(x), len(x))]))
        noise.append(residuals[generator.integers(0, len(x))])
    return BootstrapFits(base, fits, np.asarray(noise), len(x) - PARAMETERS)


def forecast_loss(tokens: Sequence[float], losses: Sequence[float], target_tokens: float, samples: int = 200, seed: int = 0) -> tuple[Forecast, BootstrapFits]:
    """Fit, forecast at `target_tokens` with a bootstrap interval, residuals, and the forecast per fit window."""
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    reason = why_no_forecast(x, target_tokens)
    if reason:
        raise ValueError(reason)
    fit = fit_power_law(x, y)
    fits = bootstrap(x, y, samples, seed)
    low, high = fits.band(target_tokens)
    sensitivity = []
    for fraction in (1.0, 0.75, 0.5):
        k = max(MIN_POINTS, int(round(len(x) * fraction)))
        if k > len(x) or (sensitivity and sensitivity[-1]["points"] == k):
            continue
        window_fit = fit_power_law(x[-k:], y[-k:])
        sensitivity.append({"points": k, "from_tokens": float(x[-k]), "forecast": float(window_fit(target_tokens)),
                            "l_inf": window_fit.l_inf, "gamma": window_fit.gamma})
    result = Forecast(float(target_tokens), fit, float(fit(target_tokens)), float(low), float(high), len(x),
                      [float(r) for r in y - fit(x)], sensitivity)
    return result, fits


def why_no_forecast(tokens: Sequence[float], target_tokens: float) -> str | None:
    """Why the evaluations at `tokens` give no forecast at `target_tokens` (None: they do)."""
    if len(tokens) < MIN_FORECAST_POINTS:
        return f"no forecast: {len(tokens)} evaluations, a forecast needs >= {MIN_FORECAST_POINTS}"
    if target_tokens <= max(tokens):
        return f"no forecast: the target ({target_tokens:,.0f} tokens) is already observed (last evaluation at {max(tokens):,.0f})"
    return None


def forecast_if_due(tokens: Sequence[float], losses: Sequence[float], target_tokens: float | None, samples: int = 200,
                    seed: int = 0) -> tuple[Forecast, BootstrapFits] | None:
    """`forecast_loss`, or None when there is nothing to forecast (`why_no_forecast`)."""
    if not target_tokens or why_no_forecast(tokens, target_tokens):
        return None
    return forecast_loss(tokens, losses, target_tokens, samples, seed)


def observed_band(tokens: Sequence[float], losses: Sequence[float], at_tokens: float, samples: int = 50, seed: int = 0,
                  level: float = 0.90) -> tuple[float, float] | None:
    """Where the next held-out loss (at `at_tokens`) is expected, from the points before it; None with too few."""
    if why_no_forecast(tokens, at_tokens):
        return None
    return bootstrap(tokens, losses, samples, seed).band(at_tokens, level)

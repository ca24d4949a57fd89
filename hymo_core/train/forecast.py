"""The run's own loss forecast: L(D) = L_inf + a * D^-gamma, fitted robustly, with a bootstrap band.

Seed 001 ("预测运行自身分布的损失"): with the same tokenizer and data, a run's
held-out loss against tokens seen, D, follows L(D) = L_inf + a D^-gamma. Fit it
during training, look at the residuals, and show how the forecast moves with
the fit window: early points constrain the asymptote poorly.

The fit. For a fixed gamma the model is linear in (L_inf, a), so gamma is
searched on a grid and, for each, (L_inf, a) come from iteratively reweighted
least squares with Huber weights (a spike or a restart bump does not drag the
curve); the gamma with the smallest Huber loss wins, refined once on a finer
grid around it. a >= 0 (loss falls), L_inf >= 0. The band: the fit repeated on
bootstrap resamples of the points (seeded), the 5th and 95th percentiles of the
forecast at the target D.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

GAMMA_GRID = np.geomspace(0.02, 2.0, 60)
HUBER_DELTA = 1.345  # in units of the residuals' robust scale (MAD): 95 % efficiency under Gaussian noise
MIN_POINTS = 4


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
    fits: list[PowerLaw]
    spread: float  # residual scale: the band adds the point noise to the curve's uncertainty

    def band(self, tokens: float, low: float = 5.0, high: float = 95.0) -> tuple[float, float]:
        values = np.array([f(tokens) for f in self.fits])
        lo, hi = np.percentile(values, [low, high])
        return float(lo - 1.645 * self.spread), float(hi + 1.645 * self.spread)


def bootstrap(tokens: Sequence[float], losses: Sequence[float], samples: int = 200, seed: int = 0) -> BootstrapFits:
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    generator = np.random.default_rng(seed)
    fits = []
    for _ in range(samples):
        pick = generator.integers(0, len(x), len(x))
        if len(np.unique(x[pick])) < MIN_POINTS:
            continue
        fits.append(fit_power_law(x[pick], y[pick]))
    base = fit_power_law(x, y)
    return BootstrapFits(fits or [base], _robust_scale(y - base(x)))


def forecast_loss(tokens: Sequence[float], losses: Sequence[float], target_tokens: float, samples: int = 200, seed: int = 0) -> tuple[Forecast, BootstrapFits]:
    """Fit, forecast at `target_tokens` with a bootstrap interval, residuals, and the forecast per fit window."""
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    fit = fit_power_law(x, y)
    fits = bootstrap(x, y, samples, seed)
    values = np.array([f(target_tokens) for f in fits.fits])
    low, high = np.percentile(values, [5.0, 95.0])
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


def observed_band(tokens: Sequence[float], losses: Sequence[float], at_tokens: float, samples: int = 50, seed: int = 0) -> tuple[float, float] | None:
    """Where the next held-out loss (at `at_tokens`) is expected, from the points before it; None with too few."""
    if len(tokens) < MIN_POINTS + 1:
        return None
    return bootstrap(tokens, losses, samples, seed).band(at_tokens)

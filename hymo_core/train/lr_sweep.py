"""`hymo sweep lr`: train one proxy per peak LR on a log grid, draw the LR-sensitivity curve, pick the optimum.

Wortsman et al. (small-scale proxies for large-scale instabilities) and seed 001's Lab 3 read the
final loss against log LR. Every run shares the recipe, token budget and data order; only
`peak_lr` and `seed` change. The score of a run is its final model's mean loss over fixed
validation windows, kept per window so the uncertainty can resample them.

The optimum is the vertex of a quadratic in log LR fitted to the mean loss at the grid's best point
and its neighbour on each side (the parabola through those three points, so far-off LRs do not bend it).
Where the best grid point lies on the edge of the grid, or the local fit is not convex, the optimum
is not bracketed: the sweep says so and reports the best grid point instead of extrapolating.

Its interval must not claim more than the sweep shows. A three-point vertex always lies between the
best point's neighbours, and on a real, asymmetric LR curve (a slow rise below the optimum, a steep
one above) it is biased, so a bootstrap of the vertex alone is narrow and can miss the optimum
entirely. What the grid does show, for a curve with one minimum, is that the optimum lies between the
best grid point's two neighbours. So a paired bootstrap (seeds and validation windows resampled with
replacement, the same draw at every LR) takes, per draw, that bracket around the draw's own best grid
point, and the interval is the 2.5th percentile of the brackets' low ends to the 97.5th of their high
ends, joined with the vertex's own bootstrap interval (`vertex_interval_log_lr`, which assumes the
parabola). It reaches past the neighbours whenever resampling moves the best point, and an end is
*open* when more than 2.5 % of draws put the best point on that end of the grid: the optimum may
then lie outside the swept range, and the interval stops at the range with the flag set.
A run whose loss goes non-finite counts as diverged: +inf, which never wins.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from hymo_core.checkpoint.load import load_model
from hymo_core.models.configs import ModelConfig
from hymo_core.train.config import SUMMARY_FILE, TrainConfig
from hymo_core.train.data import CorpusReader, ValidationLoader

SWEEP_FILE, SWEEP_PICTURE = "lr_sweep.json", "lr_sweep.png"
FIT_NEIGHBOURS = 1  # grid points each side of the best one: the parabola through three points, local to the optimum


def log_grid(lr_min: float, lr_max: float, points: int) -> list[float]:
    """`points` LRs evenly spaced in log between lr_min and lr_max (both included)."""
    if not (0 < lr_min < lr_max) or points < 3:
        raise ValueError(f"an LR grid needs 0 < lr_min < lr_max and >= 3 points, got {lr_min}, {lr_max}, {points}")
    return [float(v) for v in np.geomspace(lr_min, lr_max, points)]


@torch.no_grad()
def window_losses(checkpoint: str | Path, corpus: str | Path, seq_len: int, batches: int, batch_size: int) -> list[float]:
    """Mean next-token loss of each validation window (the validation prefix the run itself scored)."""
    model, _ = load_model(checkpoint)
    model.eval()
    loader = ValidationLoader(CorpusReader(corpus), seq_len, batch_size, max_batches=batches)
    if len(loader) == 0:
        raise ValueError(f"{corpus}: the validation split has no full batch of {batch_size} x {seq_len + 1} tokens")
    out: list[float] = []
    for x_BT, y_BT in loader:
        logits_BTV, _ = model(x_BT)
        ce_BT = F.cross_entropy(logits_BTV.float().transpose(1, 2), y_BT, reduction="none")
        out += ce_BT.mean(dim=1).tolist()
    return out


def fit_optimum(log_lrs: np.ndarray, losses: np.ndarray) -> dict[str, Any]:
    """Vertex of a quadratic in log LR around the best finite point; `bracketed` False when it is not interior."""
    finite = np.isfinite(losses)
    if not finite.any():
        return {"log_lr": None, "bracketed": False, "best_index": None}
    best = int(np.nanargmin(np.where(finite, losses, np.nan)))
    lo, hi = max(0, best - FIT_NEIGHBOURS), min(len(losses), best + FIT_NEIGHBOURS + 1)
    x, y = log_lrs[lo:hi][finite[lo:hi]], losses[lo:hi][finite[lo:hi]]
    edge = best in (0, len(losses) - 1) or not (finite[best - 1] and finite[best + 1])
    if edge or len(x) < 3:
        return {"log_lr": float(log_lrs[best]), "bracketed": False, "best_index": best}
    a, b, c = np.polyfit(x, y, 2)
    if a <= 0:
        return {"log_lr": float(log_lrs[best]), "bracketed": False, "best_index": best}
    vertex = float(np.clip(-b / (2 * a), log_lrs[best - 1], log_lrs[best + 1]))
    return {"log_lr": vertex, "bracketed": True, "best_index": best, "coefficients": [float(a), float(b), float(c)],
            "fit_range": [float(x.min()), float(x.max())]}


EDGE_FRACTION = 0.025  # draws with the best point on a grid end beyond which that side of the interval is open


def _best_index(losses: np.ndarray) -> int | None:
    finite = np.isfinite(losses)
    return int(np.nanargmin(np.where(finite, losses, np.nan))) if finite.any() else None


def bootstrap_optimum(log_lrs: np.ndarray, losses_LSW: np.ndarray, draws: int = 500, seed: int = 0) -> dict[str, Any]:
    """The fit on the mean curve, and the interval the sweep supports when seeds and windows are resampled (paired
    across LRs; see the module docstring). `losses_LSW`: (LRs, seeds, windows); a diverged run is +inf in every window.
    """
    point = fit_optimum(log_lrs, losses_LSW.mean(axis=(1, 2)))
    rng = np.random.default_rng(seed)
    L, S, W = losses_LSW.shape
    vertices, lows, highs, at_low, at_high = [], [], [], 0, 0
    for _ in range(draws):
        seeds, windows = rng.integers(0, S, S), rng.integers(0, W, W)
        curve = losses_LSW[:, seeds][:, :, windows].mean(axis=(1, 2))
        best = _best_index(curve)
        if best is None:
            continue
        fit = fit_optimum(log_lrs, curve)
        vertices.append(fit["log_lr"])
        lows.append(log_lrs[max(best - 1, 0)])
        highs.append(log_lrs[min(best + 1, L - 1)])
        at_low, at_high = at_low + (best == 0), at_high + (best == L - 1)
    if not vertices:
        nan = [math.nan, math.nan]
        return {**point, "draws": draws, "interval_log_lr": nan, "vertex_interval_log_lr": nan, "open_ends": [True, True],
                "edge_fraction": [math.nan, math.nan], "bootstrap_se_log_lr": math.nan}
    vertices_ = np.asarray(vertices)
    vertex_low, vertex_high = (float(v) for v in np.percentile(vertices_, [2.5, 97.5]))
    low = min(float(np.quantile(lows, 0.025, method="inverted_cdf")), vertex_low)
    high = max(float(np.quantile(highs, 0.975, method="inverted_cdf")), vertex_high)
    edge_fraction = [at_low / len(vertices), at_high / len(vertices)]
    best = point["best_index"]
    open_ends = [edge_fraction[0] > EDGE_FRACTION or best == 0, edge_fraction[1] > EDGE_FRACTION or best == L - 1]
    return {**point, "draws": draws, "interval_log_lr": [low, high], "vertex_interval_log_lr": [vertex_low, vertex_high],
            "open_ends": open_ends, "edge_fraction": edge_fraction,
            "bootstrap_se_log_lr": float(vertices_.std(ddof=1)) if len(vertices_) > 1 else math.nan}


def run_sweep(corpus: str | Path, out: str | Path, train_config: TrainConfig, model_config: ModelConfig, lrs: list[float],
              seeds: list[int], *, train: Callable[..., dict[str, Any]] | None = None, log: Callable[[str], None] = print,
              plot: bool = True) -> dict[str, Any]:
    """Train (or reuse) one run per (LR, seed) under `out/`, score each, fit the optimum; writes lr_sweep.json (+ .png).

    A run directory whose summary.json already reached max_steps is reused, so an interrupted
    sweep re-run trains only what is missing.
    """
    from hymo_core.train.run import run_training
    from manifests.staleness import refuse_stale_corpus  # here, not at import: the core imports no pipeline code

    refuse_stale_corpus(corpus, "sweep")  # before the first proxy trains
    train = train or run_training
    out = Path(out)
    lrs = sorted(float(lr) for lr in lrs)
    if len(lrs) < 3 or len(set(lrs)) != len(lrs) or not seeds:
        raise ValueError(f"an LR sweep needs >= 3 distinct LRs and >= 1 seed, got {lrs} and {seeds}")
    runs, losses = [], []
    for lr in lrs:
        per_seed = []
        for seed in seeds:
            directory = out / f"lr-{lr:.3e}" / f"seed-{seed}"
            config = replace(train_config, peak_lr=lr, seed=seed)
            summary_path = directory / SUMMARY_FILE
            summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else None
            diverged = False
            if summary is None or summary.get("final_step") != config.max_steps:
                log(f"lr {lr:.3e} seed {seed}: training {config.max_steps} steps in {directory}")
                try:
                    summary = train(corpus, directory, config, model_config, resume=True, cloze_path=None, progress=False,
                                    log=lambda *args, **kwargs: None)
                except FloatingPointError as exc:
                    log(f"lr {lr:.3e} seed {seed}: diverged ({exc})")
                    diverged = True
            windows = None if diverged else window_losses(summary["checkpoint"], corpus, config.seq_len, config.eval_batches,
                                                          config.batch_size)
            if windows is not None and not all(math.isfinite(w) for w in windows):
                windows = None
            per_seed.append(windows)
            runs.append({"lr": lr, "seed": seed, "dir": str(directory), "diverged": windows is None,
                         "val_loss": float(np.mean(windows)) if windows else math.inf})
        width = max((len(w) for w in per_seed if w), default=1)
        losses.append([w if w else [math.inf] * width for w in per_seed])
    losses_LSW = np.asarray(losses, dtype=np.float64)
    log_lrs = np.log(np.asarray(lrs))
    fit = bootstrap_optimum(log_lrs, losses_LSW)
    grid_step = float(np.mean(np.diff(log_lrs)))
    result = {
        "lrs": lrs, "seeds": list(seeds), "windows": int(losses_LSW.shape[2]), "runs": runs,
        "mean_loss": [float(v) for v in losses_LSW.mean(axis=(1, 2))],
        "seed_spread": [float(v) for v in losses_LSW.mean(axis=2).std(axis=1, ddof=1)] if len(seeds) > 1 else None,
        "optimum_lr": (math.exp(fit["log_lr"]) if fit["bracketed"] else lrs[fit["best_index"]]) if fit["log_lr"] is not None else None,
        "interval_lr": [math.exp(v) if math.isfinite(v) else None for v in fit["interval_log_lr"]],
        "interval_open": fit["open_ends"],  # [below the grid, above it]: the optimum may lie outside the swept range
        "bracketed": fit["bracketed"], "grid_step_log": grid_step, "fit": fit,
        "train_config": train_config.to_dict(), "model": {"d_model": model_config.d_model,
                                                           "parametrisation": model_config.parametrisation},
    }
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (SWEEP_FILE + ".tmp")
    tmp.write_text(json.dumps(_finite(result), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(out / SWEEP_FILE)
    if plot:
        plot_sweeps({f"d={model_config.d_model}": result}, out / SWEEP_PICTURE)
    return result


def _finite(value: Any) -> Any:
    """The result with every non-finite float as null (strict JSON: a diverged run's loss is null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def plot_sweeps(sweeps: dict[str, dict[str, Any]], path: Path, title: str = "LR sensitivity") -> None:
    """Mean validation loss against peak LR (log x) per sweep: seeds thin, the fitted parabola, the optimum and its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (label, sweep), colour in zip(sweeps.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        lrs = np.asarray(sweep["lrs"])
        finite = np.isfinite(sweep["mean_loss"])
        ax.plot(lrs[finite], np.asarray(sweep["mean_loss"])[finite], "o-", color=colour, label=label)
        for seed in sweep["seeds"]:
            rows = [r for r in sweep["runs"] if r["seed"] == seed and not r["diverged"]]
            ax.plot([r["lr"] for r in rows], [r["val_loss"] for r in rows], "-", color=colour, alpha=0.25, lw=0.8)
        fit = sweep["fit"]
        if fit.get("coefficients"):
            x = np.linspace(*fit["fit_range"], 50)
            ax.plot(np.exp(x), np.polyval(fit["coefficients"], x), "--", color=colour, lw=1)
        if sweep["optimum_lr"]:
            ax.axvline(sweep["optimum_lr"], color=colour, lw=1, alpha=0.8)
            low, high = sweep["interval_lr"]
            if low and high:
                ax.axvspan(low, high, color=colour, alpha=0.12)
    ax.set_xscale("log")
    ax.set_xlabel("peak LR")
    ax.set_ylabel("final validation loss (nats/token)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)

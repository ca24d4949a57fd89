"""The comparison as people read it: one markdown table row per variant, and a figure of the improvements."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def _pm(value: float, se: float, digits: int = 4) -> str:
    return f"{value:+.{digits}f} ± {se:.{digits}f}"


def markdown_table(comparison: dict[str, Any]) -> str:
    rule_metric = comparison["rule"]["metric"]
    header = ("| variant | recomputed stages | base bpb | variant bpb | bpb improvement ± se (items, seed sd) | per seed "
              "| suite acc_norm change ± se | verdict |")
    lines = [header, "|" + "---|" * 8]
    for name, row in comparison["variants"].items():
        bpb, acc = row["heldout_bpb"], row["suite_accuracy"]
        acc_cell = "—" if acc is None else f"{_pm(acc['improvement'], acc['se'], 3)} (n={acc['n']})"
        lines.append(
            f"| {name} | {', '.join(row['recomputed']) or 'none'} | {bpb['base']:.4f} | {bpb['variant']:.4f} "
            f"| {_pm(bpb['improvement'], bpb['se'])} ({bpb['se_items']:.4f}, {bpb['seed_sd']:.4f}; n={bpb['n']} docs) "
            f"| {', '.join(f'{v:+.4f}' for v in bpb['per_seed'])} | {acc_cell} "
            f"| **{row['verdict']}** ({rule_metric}, ±{_multiplier(row[rule_metric], comparison):.2f} se; {_budget(row)}) |")
    return "\n".join(lines)


def _multiplier(row: dict[str, Any] | None, comparison: dict[str, Any]) -> float:
    """The half-width in se the row was judged with (older comparisons: the rule's fixed z)."""
    if row is not None and row.get("multiplier") is not None:
        return row["multiplier"]
    return comparison["rule"].get("z") or 1.96


def _budget(row: dict[str, Any]) -> str:
    return row.get("train_tokens") or "at an unrecorded training budget"


def source_table(comparison: dict[str, Any]) -> str:
    lines = ["| variant | source | documents | base bpb | bpb improvement ± se |", "|---|---|---|---|---|"]
    for name, row in comparison["variants"].items():
        for source, s in row["per_source_bpb"].items():
            lines.append(f"| {name} | {source} | {s['n']} | {s['base']:.4f} | {_pm(s['improvement'], s['se'])} |")
    return "\n".join(lines)


def draw(comparison: dict[str, Any], path: Path) -> Path:
    """Improvement per variant with the interval the rule judged it by (bars) and each seed's own pair (dots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = comparison["rule"]["metric"]
    min_effect = comparison["rule"]["min_effect"]
    names = list(comparison["variants"])
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.6 * len(names)))
    for y, name in enumerate(names):
        row = comparison["variants"][name][metric]
        if row is None:
            continue
        ax.errorbar(row["improvement"], y, xerr=_multiplier(row, comparison) * row["se"], fmt="o", color="black", capsize=4)
        ax.scatter(row["per_seed"], [y] * len(row["per_seed"]), color="tab:blue", s=14, zorder=3)
    ax.axvline(0, color="grey", lw=1)
    for edge in (-min_effect, min_effect):
        ax.axvline(edge, color="grey", lw=0.8, ls="--")
    ax.set_yticks(range(len(names)), [f"{n}\n({comparison['variants'][n]['verdict']})" for n in names])
    ax.set_xlabel(f"{metric} improvement over the base (bars: the rule's interval; dots: seeds; dashed: ±min_effect)")
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path

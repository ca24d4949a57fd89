"""The funnel table a run ends with: per stage in / kept / removed, and the largest rules."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from manifests.audit_query import funnel

from flows.console import console


def _rules(counts: dict[str, int], top: int = 3) -> str:
    """The largest rules of a stage; `hymo audit summary --json` has all of them."""
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{rule} {n}" for rule, n in ranked[:top])
    return (shown + (f", +{len(ranked) - top} more rules" if len(ranked) > top else "")) or "-"


def _rule_lines(row: dict[str, Any], top: int = 3) -> str:
    """The largest rules of a stage, one per line: `-` removed, `~` modified, `>` routed."""
    marked = [(f"{mark}{rule}", n) for mark, key in (("-", "removed"), ("~", "modified"), (">", "routed")) for rule, n in row[key].items()]
    ranked = sorted(marked, key=lambda kv: -kv[1])
    lines = [f"{rule} {n}" for rule, n in ranked[:top]] + ([f"+{len(ranked) - top} more rules"] if len(ranked) > top else [])
    return "\n".join(lines) or "-"


def print_narrow_funnel(run: Path) -> None:
    """The funnel for a terminal under 100 columns: one rules column, one rule per line, no rule name cut."""
    from rich import box

    table = Table(title=f"HyMo funnel — {run.name}", box=box.SIMPLE_HEAD, caption="rules: - removed, ~ modified, > routed; all: hymo audit summary --json")
    for column in ("stage", "in", "kept", "removed", "rules", "s"):
        table.add_column(column, justify="left" if column in ("stage", "rules") else "right", no_wrap=column != "rules", overflow="ellipsis")
    for row in funnel(run):
        if not row["documents"]:
            table.add_row(row["stage"], "", "", "", "(artifacts)", f"{row['wall_time_s']:.0f}")
            continue
        table.add_row(row["stage"], str(row["in"]), str(row["kept"]), str(sum(row["removed"].values())), _rule_lines(row), f"{row['wall_time_s']:.0f}")
    console.print(table)


def print_funnel(run: Path) -> None:
    if console.width < 100:
        print_narrow_funnel(run)
        return
    table = Table(title=f"HyMo funnel — {run}")
    for column in ("stage", "in", "kept", "removed", "removed by rule", "modified by rule", "seconds"):
        table.add_column(column, justify="right" if column in ("in", "kept", "removed", "seconds") else "left", overflow="fold")
    for row in funnel(run):
        if not row["documents"]:  # tokenizer, mixture, shards, pretrain: artifacts, not documents
            table.add_row(row["stage"], "", "", "", "", "(artifacts)", f"{row['wall_time_s']:.1f}")
            continue
        table.add_row(row["stage"], str(row["in"]), str(row["kept"]), str(sum(row["removed"].values())), _rules(row["removed"]),
                      _rules({**row["modified"], **{f"{k} (routed)": v for k, v in row["routed"].items()}}), f"{row['wall_time_s']:.1f}")
    console.print(table)

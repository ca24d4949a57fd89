"""The funnel table a run ends with: per stage in / kept / removed, and the largest rules."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from manifests.audit_query import funnel
from manifests.staleness import stale_stages

from flows.console import console


def _rules(counts: dict[str, int], top: int = 3) -> str:
    """The largest rules of a stage; `hymo audit summary --json` has all of them."""
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{rule} {n}" for rule, n in ranked[:top])
    return (shown + (f", +{len(ranked) - top} more rules" if len(ranked) > top else "")) or "-"


def _ranked_rules(row: dict[str, Any], top: int = 3) -> list[str]:
    """The largest rules of a stage: `-` removed, `~` modified, `>` routed; then how many more."""
    marked = [(f"{mark}{rule}", n) for mark, key in (("-", "removed"), ("~", "modified"), (">", "routed")) for rule, n in row[key].items()]
    ranked = sorted(marked, key=lambda kv: -kv[1])
    return [f"{rule} {n}" for rule, n in ranked[:top]] + ([f"+{len(ranked) - top} more rules"] if len(ranked) > top else [])


def print_narrow_funnel(run: Path) -> None:
    """The funnel for a terminal under 100 columns: the counts in columns, and each stage's rules on lines of their
    own beneath it, indented, so no rule name is cut (the longest, `max_fineweb_duplicate_line_char_fraction`, has
    42 characters: a rules column beside the counts would have ~30 at 80 columns)."""
    from rich.text import Text

    rows = funnel(run)
    name_width = max([len("stage")] + [len(row["stage"]) for row in rows])
    numbers = [str(row[key]) for row in rows if row["documents"] for key in ("in", "kept")]
    width = max([len("removed")] + [len(n) for n in numbers])
    header = f"{'stage':<{name_width}}  {'in':>{width}}  {'kept':>{width}}  {'removed':>{width}}  {'s':>5}"
    console.print(Text(f"HyMo funnel — {run.name}", style="bold"))
    console.print(Text(header, style="bold"))
    for row in rows:
        if not row["documents"]:
            console.print(Text(f"{row['stage']:<{name_width}}  {'(artifacts)':>{3 * width + 4}}  {row['wall_time_s']:>5.0f}"), soft_wrap=True)
            continue
        removed = sum(row["removed"].values())
        console.print(Text(f"{row['stage']:<{name_width}}  {row['in']:>{width}}  {row['kept']:>{width}}  {removed:>{width}}  "
                           f"{row['wall_time_s']:>5.0f}"), soft_wrap=True)
        for line in _ranked_rules(row):
            console.print(Text(f"    {line}"), soft_wrap=True)  # soft wrap: a line wider than the terminal wraps, never cut
    console.print(Text("rules: - removed, ~ modified, > routed; all: hymo audit summary --json", style="dim"))


def print_funnel(run: Path) -> None:
    if console.width < 100:
        print_narrow_funnel(run)
    else:
        print_wide_funnel(run)


def print_stale(run: Path) -> None:
    """One `!` line per stale stage (after a rerun that changed a stage, the ones it left behind), unwrapped so its
    refresh command copies whole."""
    for entry in stale_stages(run):
        console.print(f"! {entry.line()}", markup=False, soft_wrap=True)


def print_wide_funnel(run: Path) -> None:
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

"""`hymo plan ...`: planning calculators. `hymo plan lsh` sizes MinHash-LSH bands (seed 001, "推导 LSH 分带").

`hymo plan model` and `hymo plan batch` come from hymo_core.planner.cli (`add_cli`, `add_batch_cli`),
imported only when that module exists.
"""
from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from tasks.dedup.minhash import approximate_threshold, candidate_probability, feasible_band_layouts

SIMILARITIES = (0.5, 0.6, 0.7, 0.8, 0.9)  # the seed's S-curve table columns
SEED_LAYOUTS = ((16, 8), (14, 8), (32, 4), (8, 16))


def s_curve_line(bands: int, rows: int) -> str:
    values = " ".join(f"{float(candidate_probability(s, bands, rows)):.3f}" for s in SIMILARITIES)
    return f"b={bands:2d} r={rows:2d} threshold {approximate_threshold(bands, rows):.2f} | P at s=0.5..0.9: {values}"


def cmd_plan_lsh(args: argparse.Namespace) -> int:
    if args.seed_table:
        for bands, rows in SEED_LAYOUTS:
            print(s_curve_line(bands, rows))
        return 0
    if args.bands or args.rows:
        if not (args.bands and args.rows):
            print("hymo plan lsh: give both --bands and --rows for an S-curve")
            return 2
        print(s_curve_line(args.bands, args.rows))
        return 0
    layouts = feasible_band_layouts(args.hashes, args.catch, args.catch_probability, args.reject, args.reject_probability)
    print(f"signature length ≤ {args.hashes}: catch J={args.catch} with P ≥ {args.catch_probability}, "
          f"reject J={args.reject} with P ≤ {args.reject_probability}")
    if not layouts:
        print("no feasible (bands, rows): allow more hashes or loosen the targets")
        return 1
    print(f"{'bands':>5} {'rows':>4} {'hashes':>6} {'P(catch)':>9} {'P(reject)':>9} {'threshold':>9}")
    for bands, rows, p_catch, p_reject in layouts[: args.limit]:
        print(f"{bands:5d} {rows:4d} {bands * rows:6d} {p_catch:9.4f} {p_reject:9.4f} {approximate_threshold(bands, rows):9.2f}")
    if len(layouts) > args.limit:
        print(f"... {len(layouts) - args.limit} more feasible layouts (--limit)")
    bands, rows, _, _ = layouts[0]
    print(f"fewest hashes: b={bands} r={rows} ({bands * rows} hashes)")
    print(s_curve_line(bands, rows))
    return 0


def add_lsh(plan_subparsers: Any) -> None:
    lsh = plan_subparsers.add_parser("lsh", help="feasible (bands, rows) for MinHash-LSH targets, or one layout's S-curve")
    lsh.add_argument("--hashes", type=int, default=128, help="largest signature length to consider (default 128)")
    lsh.add_argument("--catch", type=float, default=0.85, help="a Jaccard that must become a candidate (default 0.85)")
    lsh.add_argument("--catch-probability", type=float, default=0.95, help="... with at least this probability (default 0.95)")
    lsh.add_argument("--reject", type=float, default=0.5, help="a Jaccard that must not become a candidate (default 0.5)")
    lsh.add_argument("--reject-probability", type=float, default=0.05, help="... with at most this probability (default 0.05)")
    lsh.add_argument("--bands", type=int, help="print the S-curve P = 1-(1-s^r)^b at s=0.5..0.9 for these bands ...")
    lsh.add_argument("--rows", type=int, help="... and rows")
    lsh.add_argument("--seed-table", action="store_true", help="the S-curves of the seed's four layouts (16×8, 14×8, 32×4, 8×16)")
    lsh.add_argument("--limit", type=int, default=10, help="feasible layouts to list (default 10)")
    lsh.set_defaults(func=cmd_plan_lsh)


def add_commands(subparsers: Any) -> None:
    plan = subparsers.add_parser("plan", help="planning calculators (lsh; model when hymo_core.planner.planner is present)")
    plan_subparsers = plan.add_subparsers(dest="plan_command", required=True)
    add_lsh(plan_subparsers)
    if importlib.util.find_spec("hymo_core.planner.planner") is not None:
        from hymo_core.planner.cli import add_batch_cli, add_cli

        add_cli(plan_subparsers)
        add_batch_cli(plan_subparsers)

"""`hymo ablate SPEC.toml`: a spec's variants x seeds through the pipeline (cached stages reused), then one verdict each."""
from __future__ import annotations

import argparse
from typing import Any

from flows.console import console


def cmd_ablate(args: argparse.Namespace) -> int:
    import json

    from flows.ablate_flow import base_run_checked, hymo_ablate
    from flows.ablate_spec import SpecError, load_spec
    from flows.pipeline import Runner
    from flows.server import prefect_api

    try:
        base_run_checked(load_spec(args.spec), args.base_run)  # a spec error or a stale base run is one line, before any server starts
    except SpecError as error:
        raise SystemExit(f"hymo ablate: {error}") from None
    with prefect_api(args.api_url):
        result = hymo_ablate(spec=args.spec, out=args.out, base_run=args.base_run, runner=Runner(args.runner),
                             dask_address=args.dask_address)
    comparison = json.loads(open(result["comparison"], encoding="utf-8").read())
    for name, row in comparison["variants"].items():
        bpb = row["heldout_bpb"]
        console.print(f"{name}: {row['statement']} (bpb {bpb['base']:.4f} -> {bpb['variant']:.4f}, improvement "
                      f"{bpb['improvement']:+.4f} ± {bpb['se']:.4f}; recomputed {', '.join(row['recomputed']) or 'nothing'})", markup=False)
    console.print(f"wrote {result['out']}/comparison.json, comparison.md, comparison.png", markup=False)
    return 0


def add_commands(subparsers: Any) -> None:
    parser = subparsers.add_parser("ablate", help="train proxies of a spec's variants over cached stages and decide with a rule fixed in advance")
    parser.add_argument("spec", help="the ablation spec TOML (flows/ablate_spec.py describes it)")
    parser.add_argument("--out", help="output directory (default: $HYMO_HOME/runs/ablate-SPECNAME)")
    parser.add_argument("--base-run", help="a finished run of the base config (e.g. runs/sample) whose stages the base reuses")
    parser.add_argument("--runner", choices=["process", "thread", "dask"], default="process", help="where shard batches run (as hymo run)")
    parser.add_argument("--dask-address", help="tcp://HOST:8786 of an existing Dask scheduler (with --runner dask)")
    parser.add_argument("--api-url", help="Prefect API to report to (default: $PREFECT_API_URL, else a local server started for this run)")
    parser.set_defaults(func=cmd_ablate)

"""`hymo manifest show`: the stage manifests of a run, then its corpus table."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from manifests.run_dir import completed_stages
from manifests.staleness import stale_stages

from flows.cli.trace import print_corpus_table
from flows.console import console


def cmd_manifest_show(args: argparse.Namespace) -> int:
    stages = completed_stages(Path(args.run), verify=args.verify, full=args.verify)
    stale = {s.directory: s for s in stale_stages(Path(args.run))} if args.verify else {}
    if args.json:
        print(json.dumps([m.to_json() for _, m in stages], indent=2, ensure_ascii=False))
        return 0
    table = Table(title=f"stage manifests — {args.run}")
    for column in ("dir", "stage", "version", "cache key", "files", "rows", "in", "kept", "seconds") + (("inputs",) if args.verify else ()):
        table.add_column(column)
    for stage_dir, manifest in stages:
        rows = sum(o.rows or 0 for o in manifest.files("data"))
        fresh = (("STALE" if stage_dir.path.name in stale else "current"),) if args.verify else ()
        table.add_row(stage_dir.path.name, manifest.stage, manifest.stage_version, manifest.cache_key[:12], str(len(manifest.outputs)),
                      str(rows), str(manifest.counts.get("in", "")), str(manifest.counts.get("kept", "")), f"{manifest.wall_time_s:.1f}", *fresh)
    console.print(table)
    for entry in stale.values():  # outputs intact, but computed from an upstream that has changed since
        console.print(f"! {entry.line()}", markup=False, soft_wrap=True)
    print_corpus_table(Path(args.run))
    return 1 if stale else 0


def add_commands(sub: Any) -> None:
    manifest = sub.add_parser("manifest", help="stage manifests of a run").add_subparsers(dest="manifest_command", required=True)
    show = manifest.add_parser("show", help="one line per published stage")
    show.add_argument("run", help="run directory")
    show.add_argument("--json", action="store_true", help="print JSON instead of tables")
    show.add_argument("--verify", action="store_true", help="re-hash every output file and check every stage read its upstreams' current outputs (exit 1 if a stage is stale)")
    show.set_defaults(func=cmd_manifest_show)

"""`hymo audit summary|why|sample`: what every stage decided about the documents of a run."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from manifests.audit_query import decisions_for, find_documents, funnel, quarantined_files, sample_removed
from manifests.staleness import stale_stages

from flows.cli.funnel import print_funnel
from flows.console import console


def cmd_audit_summary(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(funnel(Path(args.run)), indent=2))
    else:
        print_funnel(Path(args.run))
        print_quarantined(Path(args.run))
        for entry in stale_stages(Path(args.run)):
            console.print(f"! {entry.line()}", markup=False, soft_wrap=True)
    return 0


def print_quarantined(run: Path) -> None:
    """The input files ingest left out whole, one line each: file and reason."""
    files = quarantined_files(run)
    if files:
        console.print(f"quarantined input files ({len(files)}, [ingest] on_bad_file = \"quarantine\"):", markup=False)
        for entry in files:
            console.print(f"  {entry['file']}: {entry['reason']}", markup=False, soft_wrap=True)


def cmd_audit_why(args: argparse.Namespace) -> int:
    matches = find_documents(Path(args.run), args.doc_id)
    if not matches:
        console.print(f"[red]{args.run}: no document has the id, the source's own id or the URL {args.doc_id!r}[/red]", markup=False)
        return 1
    if len(matches) > 1:  # a URL in several files or snapshots: say which, the user picks one
        if args.json:
            print(json.dumps({"key": args.doc_id, "matches": matches}, indent=2, ensure_ascii=False))
            return 0
        console.print(f"{len(matches)} documents match {args.doc_id!r}; ask again with one id:", markup=False)
        for match in matches:
            own = f" record_id={match['record_id']}" if match.get("record_id") else ""
            console.print(f"  {match['id']}  {match['file']} #{match['ordinal']}{own}", markup=False)
        return 0
    try:
        answer = decisions_for(Path(args.run), matches[0]["id"])
    except KeyError as exc:
        console.print(f"[red]{exc.args[0]}[/red]")
        return 1
    if args.json:
        print(json.dumps(answer, indent=2, ensure_ascii=False))
        return 0
    console.print(f"[bold]{answer['id']}[/bold]: {answer['final']}")
    for step in answer["stages"]:
        console.print(f"  {step['stage']:<12} {step['decision']}")
        for entry in step["entries"]:
            measured = "" if entry["value"] is None else f" value={entry['value']:g}"
            limit = "" if entry["threshold"] is None else f" threshold={entry['threshold']:g}"
            console.print(f"    {entry['action']}: {entry['rule']}{measured}{limit} {json.dumps(entry['detail'], ensure_ascii=False)[:300]}", markup=False)
    return 0


def cmd_audit_sample(args: argparse.Namespace) -> int:
    rows = sample_removed(Path(args.run), args.stage, args.rule, args.n)
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    table = Table(title=f"{args.stage}: {args.rule or 'all rules'}")
    for column in ("id", "action", "rule", "value", "threshold", "snippet"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row["id"], row["action"], row["rule"], "" if row["value"] is None else f"{row['value']:g}",
                      "" if row["threshold"] is None else f"{row['threshold']:g}", row.get("snippet", "").replace("\n", " ")[:120])
    console.print(table)
    return 0


def add_commands(sub: Any) -> None:
    audit = sub.add_parser("audit", help="per-document decisions of a run").add_subparsers(dest="audit_command", required=True)
    summary = audit.add_parser("summary", help="funnel: per stage in / kept / removed and modified per rule")
    summary.add_argument("run", help="run directory")
    summary.add_argument("--json", action="store_true", help="print JSON instead of a table")
    summary.set_defaults(func=cmd_audit_summary)
    why = audit.add_parser("why", help="every stage's decision about one document")
    why.add_argument("run", help="run directory")
    why.add_argument("doc_id", help="a HyMo id, the source's own id of the record (meta.record_id) or its URL")
    why.add_argument("--json", action="store_true", help="print JSON instead of text")
    why.set_defaults(func=cmd_audit_why)
    sample = audit.add_parser("sample", help="audit rows of one stage, with snippets")
    sample.add_argument("run", help="run directory")
    sample.add_argument("--stage", required=True, help="stage name, e.g. quality")
    sample.add_argument("--rule", help="only rows of this rule (default: every rule)")
    sample.add_argument("-n", type=int, default=10, help="rows to show (default 10)")
    sample.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sample.set_defaults(func=cmd_audit_sample)

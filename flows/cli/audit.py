"""`hymo audit summary|why|show|sample`: what every stage decided about the documents of a run."""
from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from rich.table import Table

from manifests.audit_query import decisions_for, find_documents, funnel, quarantined_files, sample_removed
from manifests.staleness import stale_stages

from flows.cli.funnel import print_funnel, print_stale
from flows.console import console


def cmd_audit_summary(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(funnel(Path(args.run)), indent=2))
    else:
        print_funnel(Path(args.run))
        print_quarantined(Path(args.run))
        print_stale(Path(args.run))
    return 0


def print_quarantined(run: Path) -> None:
    """The input files ingest left out whole, one line each: file and reason."""
    files = quarantined_files(run)
    if files:
        console.print(f"quarantined input files ({len(files)}, [ingest] on_bad_file = \"quarantine\"):", markup=False)
        for entry in files:
            console.print(f"  {entry['file']}: {entry['reason']}", markup=False, soft_wrap=True)


def one_match(args: argparse.Namespace) -> dict[str, Any] | int:
    """The document `args.doc_id` names (an id, a record_id or a URL) as find_documents gives it (its id and the shard
    that holds it), or the exit code after saying why there is none: 1 when nothing matches, 0 after listing the
    documents a URL in several files or snapshots matches."""
    matches = find_documents(Path(args.run), args.doc_id)
    if not matches:
        console.print(f"{args.run}: no document has the id, the source's own id or the URL {args.doc_id!r}", markup=False, style="red", soft_wrap=True)
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
    return matches[0]


def cmd_audit_why(args: argparse.Namespace) -> int:
    match = one_match(args)
    if isinstance(match, int):
        return match
    try:
        answer = decisions_for(Path(args.run), match["id"], match.get("shard"))
    except KeyError as exc:
        console.print(f"[red]{exc.args[0]}[/red]")
        return 1
    stale = {entry.stage: entry for entry in stale_stages(Path(args.run))}
    if args.json:
        print(json.dumps({**answer, "stale": [entry.line() for entry in stale.values()]}, indent=2, ensure_ascii=False))
        return 0
    console.print(f"[bold]{answer['id']}[/bold]: {answer['final']}")
    for step in answer["stages"]:
        mark = "  (STALE: computed from inputs changed since; see below)" if step["stage"] in stale else ""
        console.print(f"  {step['stage']:<12} {step['decision']}{mark}", markup=False)
        for entry in step["entries"]:
            measured = "" if entry["value"] is None else f" value={entry['value']:g}"
            limit = "" if entry["threshold"] is None else f" threshold={entry['threshold']:g}"
            console.print(f"    {entry['action']}: {entry['rule']}{measured}{limit} {json.dumps(entry['detail'], ensure_ascii=False)[:300]}", markup=False)
    if stale:  # each stage's current outputs answered; the stale ones (and the shards after them) still hold the old corpus
        console.print("! warning: this run has stale stages: they, and the training shards after them, still describe the corpus "
                      "from before an upstream rerun, so the document may be there although an earlier stage now removes it", markup=False,
                      soft_wrap=True)
        for entry in stale.values():
            console.print(f"! {entry.line()}", markup=False, soft_wrap=True)
    return 0


def cmd_audit_show(args: argparse.Namespace) -> int:
    from rich.text import Text

    from manifests.stage_text import document_at, edits_of, unified_diff

    match = one_match(args)
    if isinstance(match, int):
        return match
    try:
        answer = document_at(Path(args.run), match["id"], args.stage, match.get("shard"))
    except KeyError as exc:
        console.print(str(exc.args[0]), markup=False, style="red", soft_wrap=True)
        return 1
    edits = edits_of(answer)
    if args.json:
        print(json.dumps({**answer, "edits": edits, **({"diff": unified_diff(answer)} if args.diff else {})}, indent=2, ensure_ascii=False))
        return 0
    console.print(Text(f"{answer['id']} at {answer['stage']}: {answer['decision']}", style="bold"))
    for row in answer["rows"]:
        measured = "" if row["value"] is None else f" value={row['value']:g}"
        limit = "" if row["threshold"] is None else f" threshold={row['threshold']:g}"
        console.print(f"  {row['action']}: {row['rule']}{measured}{limit}", markup=False)
    if args.diff:
        if answer["entered"] is None:
            console.print(f"({answer['stage']} is the first stage: no earlier text to compare with)", markup=False)
        console.print(Text(f"--- text entering {answer['stage']} (from {answer['previous_stage']}), +++ text it published", style="dim"))
        for line in unified_diff(answer)[2:]:
            style = "red" if line.startswith("-") else "green" if line.startswith("+") else "cyan" if line.startswith("@@") else ""
            console.print(Text(line, style=style), soft_wrap=True)
    else:
        shown = answer["text"] if answer["text"] is not None else answer["entered"]
        what = "its text" if answer["text"] is not None else f"the text it entered {answer['stage']} with (it left no text there)"
        console.print(Text(f"{what}:", style="dim"))
        console.print(Text(shown or ""), soft_wrap=True)
    if edits:
        console.print(Text(f"edits ({len([e for e in edits if 'more' not in e])} shown; offsets into the text entering {answer['stage']}):", style="bold"))
        for edit in edits:
            if "more" in edit:
                console.print(f"  {edit['rule']}: {edit['more']} more edits not recorded (a row keeps 64)", markup=False)
                continue
            line = Text(f"  [{edit['start']}, {edit['end']}) {edit['label']:<18} ")
            line.append(edit["text"][:200].replace("\n", "\u21b5"), style="black on yellow")  # the changed characters, highlighted
            console.print(line, soft_wrap=True)
    return 0


DETAIL_FIRST = ("file", "reason", "error", "why", "content_type", "kept_id", "jaccard", "matched_id", "benchmark", "item_id", "ngram",
                "lang", "top", "removed_by_reason", "kind", "count", "filter")  # what says why, before the rest
DETAIL_HIDDEN = {"edits", "edits_total", "uri", "ordinal", "record_id", "profile", "rule_set", "wanted"}  # long, or said elsewhere
WIDE_SAMPLE = 120  # columns from which the sample is a table; narrower terminals get one block per row


def detail_line(detail: dict[str, Any], limit: int = 160) -> str:
    """A row's detail as `key=value` pairs, the keys that say why first; its edits as their count."""
    keys = [k for k in DETAIL_FIRST if k in detail] + sorted(k for k in detail if k not in DETAIL_FIRST and k not in DETAIL_HIDDEN)
    parts = [f"{k}={json.dumps(detail[k], ensure_ascii=False) if not isinstance(detail[k], str) else detail[k]}" for k in keys]
    if "edits" in detail:
        parts.append(f"edits={detail.get('edits_total', len(detail['edits']))}")
    line = ", ".join(parts)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def measured(row: dict[str, Any]) -> str:
    value = "" if row["value"] is None else f"value={row['value']:g}"
    limit = "" if row["threshold"] is None else f"threshold={row['threshold']:g}"
    return " ".join(part for part in (value, limit) if part)


def cmd_audit_sample(args: argparse.Namespace) -> int:
    from rich.text import Text

    rows = sample_removed(Path(args.run), args.stage, args.rule, args.n)
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    title = f"{args.stage}: {args.rule or 'all rules'} ({len(rows)} rows)"
    if console.width >= WIDE_SAMPLE:
        table = Table(title=title)
        for column in ("id", "action", "rule", "value", "threshold", "detail", "snippet"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(row["id"], row["action"], row["rule"], "" if row["value"] is None else f"{row['value']:g}",
                          "" if row["threshold"] is None else f"{row['threshold']:g}", detail_line(row["detail"], 100),
                          row.get("snippet", "").replace("\n", " ")[:120])
        console.print(table)
        return 0
    # One block per row: the id and the decision on one line, then the detail and the snippet, two indented lines each.
    width = max(40, console.width)
    console.print(Text(title, style="bold"))
    for row in rows:
        console.print(Text(f"{row['id']}  {row['action']} {row['rule']} {measured(row)}".rstrip(), style="bold"), soft_wrap=True)
        for label, text in (("detail", detail_line(row["detail"])), ("text", " ".join(row.get("snippet", "").split()))):
            for line in textwrap.wrap(text, width - 1, initial_indent=f"  {label}: ", subsequent_indent="    ", max_lines=2, placeholder=" …"):
                console.print(Text(line), soft_wrap=True)
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
    show = audit.add_parser("show", help="one document's text at a stage, its edits highlighted; --diff against the stage's input")
    show.add_argument("run", help="run directory")
    show.add_argument("doc_id", help="a HyMo id, the source's own id of the record (meta.record_id) or its URL")
    show.add_argument("--stage", required=True, help="a document stage, e.g. quality")
    show.add_argument("--diff", action="store_true", help="a unified diff of the text entering the stage against the text it published")
    show.add_argument("--json", action="store_true", help="print JSON (text, entered text, rows, edits) instead of text")
    show.set_defaults(func=cmd_audit_show)
    sample = audit.add_parser("sample", help="audit rows of one stage, with snippets")
    sample.add_argument("run", help="run directory")
    sample.add_argument("--stage", required=True, help="stage name, e.g. quality")
    sample.add_argument("--rule", help="only rows of this rule (default: every rule)")
    sample.add_argument("-n", type=int, default=10, help="rows to show (default 10)")
    sample.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sample.set_defaults(func=cmd_audit_sample)

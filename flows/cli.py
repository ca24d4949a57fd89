"""The `hymo` command line: run the pipeline, and ask the audit log why."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from rich.table import Table

from manifests.audit_query import decisions_for, funnel, sample_removed
from manifests.run_dir import completed_stages

from flows import cli_ablate, cli_classifier, cli_cpt, cli_extend, cli_interop, cli_sweep, cli_trace, cli_train, serve
from flows.console import console
from flows.prefect_env import apply_prefect_defaults

DEFAULT_RUN = "$HYMO_HOME/runs/sample"  # HYMO_HOME: the current directory when unset (flows.config.default_run)

# Sub-command modules outside this file register here: add_commands(subparsers).
EXTRA_COMMANDS: list[Callable[[Any], None]] = [cli_trace.add_commands, cli_train.add_commands, serve.add_commands, cli_classifier.add_commands,
                                               cli_cpt.add_commands, cli_interop.add_commands, cli_sweep.add_commands,
                                               cli_extend.add_commands, cli_ablate.add_commands]


def _plan_commands(subparsers: Any) -> None:
    from flows.cli_plan import add_commands

    add_commands(subparsers)


EXTRA_COMMANDS.append(_plan_commands)


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


def cmd_run(args: argparse.Namespace) -> int:
    from flows.cluster import require_api_for_workers
    from flows.config import default_run, load_config
    from flows.pipeline import Runner, hymo_pipeline
    from flows.server import prefect_api

    require_api_for_workers(args.dask_address if args.runner == "dask" else None, args.api_url)  # before a server is started
    config = load_config(args.config)
    if args.workers:
        config = config.model_copy(update={"workers": args.workers})
    out = Path(args.out).resolve() if args.out else default_run()
    with prefect_api(args.api_url):
        hymo_pipeline(config=config, out=str(out), until=args.until, runner=Runner(args.runner), dask_address=args.dask_address,
                      change_stages=args.change_stages)
    print_funnel(out)
    return 0


def cmd_rerun(args: argparse.Namespace) -> int:
    from flows.cluster import require_api_for_workers
    from flows.pipeline import Runner
    from flows.server import prefect_api
    from flows.stage_flow import hymo_stage

    require_api_for_workers(args.dask_address if args.runner == "dask" else None, args.api_url)
    with prefect_api(args.api_url):
        hymo_stage(run=args.run, stage=args.stage, force=args.force, until=args.until, runner=Runner(args.runner), dask_address=args.dask_address)
    print_funnel(Path(args.run))
    return 0


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runner", choices=["process", "thread", "dask"], default="process", help="where shard batches run (default: worker processes)")
    parser.add_argument("--dask-address", help="tcp://HOST:8786 of an existing Dask scheduler (with --runner dask; default: a local cluster)")
    parser.add_argument("--api-url", help="Prefect API to report to (default: $PREFECT_API_URL, else a local server started for this run)")


def cmd_audit_summary(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(funnel(Path(args.run)), indent=2))
    else:
        print_funnel(Path(args.run))
    return 0


def cmd_audit_why(args: argparse.Namespace) -> int:
    try:
        answer = decisions_for(Path(args.run), args.doc_id)
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


def cmd_manifest_show(args: argparse.Namespace) -> int:
    stages = completed_stages(Path(args.run), verify=args.verify, full=args.verify)
    if args.json:
        print(json.dumps([m.to_json() for _, m in stages], indent=2, ensure_ascii=False))
        return 0
    table = Table(title=f"stage manifests — {args.run}")
    for column in ("dir", "stage", "version", "cache key", "files", "rows", "in", "kept", "seconds"):
        table.add_column(column)
    for stage_dir, manifest in stages:
        rows = sum(o.rows or 0 for o in manifest.files("data"))
        table.add_row(stage_dir.path.name, manifest.stage, manifest.stage_version, manifest.cache_key[:12], str(len(manifest.outputs)),
                      str(rows), str(manifest.counts.get("in", "")), str(manifest.counts.get("kept", "")), f"{manifest.wall_time_s:.1f}")
    console.print(table)
    cli_trace.print_corpus_table(Path(args.run))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hymo", description="HyMo: raw web pages to a pretraining corpus and a trained checkpoint.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the whole pipeline (default: the bundled real sample)")
    run.add_argument("--config", help="pipeline TOML (default: the bundled sample config)")
    run.add_argument("--out", help=f"run directory (default: {DEFAULT_RUN})")
    run.add_argument("--until", help="stop after this stage")
    run.add_argument("--change-stages", action="store_true",
                     help="the config's stage list differs from the run directory's: move the other list's stage directories aside "
                          "(to RUN.replaced-TIME) instead of refusing")
    run.add_argument("--workers", type=int, help="worker processes per stage (default: all cores)")
    add_runner_options(run)
    run.set_defaults(func=cmd_run)

    rerun = sub.add_parser("rerun", help="re-run one stage of a run (and what follows it if its output changed)")
    rerun.add_argument("run")
    rerun.add_argument("--stage", required=True)
    rerun.add_argument("--force", action="store_true", help="recompute the stage even if its published output is intact")
    rerun.add_argument("--until", help="stop after this stage")
    add_runner_options(rerun)
    rerun.set_defaults(func=cmd_rerun)

    audit = sub.add_parser("audit", help="per-document decisions of a run").add_subparsers(dest="audit_command", required=True)
    summary = audit.add_parser("summary", help="funnel: per stage in / kept / removed and modified per rule")
    summary.add_argument("run")
    summary.add_argument("--json", action="store_true")
    summary.set_defaults(func=cmd_audit_summary)
    why = audit.add_parser("why", help="every stage's decision about one document")
    why.add_argument("run")
    why.add_argument("doc_id")
    why.add_argument("--json", action="store_true")
    why.set_defaults(func=cmd_audit_why)
    sample = audit.add_parser("sample", help="audit rows of one stage, with snippets")
    sample.add_argument("run")
    sample.add_argument("--stage", required=True)
    sample.add_argument("--rule")
    sample.add_argument("-n", type=int, default=10)
    sample.add_argument("--json", action="store_true")
    sample.set_defaults(func=cmd_audit_sample)

    manifest = sub.add_parser("manifest", help="stage manifests of a run").add_subparsers(dest="manifest_command", required=True)
    show = manifest.add_parser("show", help="one line per published stage")
    show.add_argument("run")
    show.add_argument("--json", action="store_true")
    show.add_argument("--verify", action="store_true", help="re-hash every output file")
    show.set_defaults(func=cmd_manifest_show)

    for add_command in EXTRA_COMMANDS:
        add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    apply_prefect_defaults()
    parser = build_parser()
    parser.add_argument("--debug", action="store_true", help="show tracebacks (default: one line naming the stage, file and fix)")
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv  # accepted anywhere on the line, also after the sub-command
    args = parser.parse_args([a for a in argv if a != "--debug"])
    if debug:
        return args.func(args)
    from flows.errors import explain, quiet_console_tracebacks

    quiet_console_tracebacks()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("hymo: interrupted; published stages stay, a re-run continues from them", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure a user can meet ends in one line; --debug shows the traceback
        print(explain(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

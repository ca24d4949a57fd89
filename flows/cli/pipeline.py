"""`hymo run` and `hymo rerun`: the whole DAG, or one stage and what follows it."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.cli.funnel import print_funnel, print_stale

DEFAULT_RUN = "$HYMO_HOME/runs/sample"  # HYMO_HOME: the current directory when unset (flows.config.default_run)


def cmd_run(args: argparse.Namespace) -> int:
    from flows.cluster import require_api_for_workers
    from flows.config import default_run, load_config
    from flows.pipeline import Runner, hymo_pipeline
    from flows.server import prefect_api

    require_api_for_workers(args.dask_address if args.runner == "dask" else None, args.api_url)  # before a server is started
    config = load_config(args.config, args.set)
    if args.workers:
        config = config.model_copy(update={"workers": args.workers})
    out = Path(args.out).resolve() if args.out else default_run()
    with prefect_api(args.api_url):
        hymo_pipeline(config=config, out=str(out), until=args.until, runner=Runner(args.runner), dask_address=args.dask_address,
                      change_stages=args.change_stages)
    print_funnel(out)
    print_stale(out)
    return 0


def cmd_rerun(args: argparse.Namespace) -> int:
    from flows.cluster import require_api_for_workers
    from flows.pipeline import Runner
    from flows.server import prefect_api
    from flows.stage_flow import hymo_stage

    require_api_for_workers(args.dask_address if args.runner == "dask" else None, args.api_url)
    with prefect_api(args.api_url):
        hymo_stage(run=args.run, stage=args.stage, force=args.force, until=args.until, runner=Runner(args.runner), dask_address=args.dask_address,
                   overrides=args.set or None)
    print_funnel(Path(args.run))
    print_stale(Path(args.run))  # the stages this rerun left behind, each with the command that refreshes it
    return 0


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runner", choices=["process", "thread", "dask"], default="process", help="where shard batches run (default: worker processes)")
    parser.add_argument("--dask-address", help="tcp://HOST:8786 of an existing Dask scheduler (with --runner dask; default: a local cluster)")
    parser.add_argument("--api-url", help="Prefect API to report to (default: $PREFECT_API_URL, else a local server started for this run)")


def add_set_option(parser: argparse.ArgumentParser, what: str = "override one config value, e.g. --set pretrain.train.max_steps=50 "
                                                                  "or --set run.workers=2") -> None:
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=f"{what} (a TOML value; repeatable, later ones win)")


def add_commands(sub: Any) -> None:
    run = sub.add_parser("run", help="run the whole pipeline (default: the bundled real sample)")
    run.add_argument("--config", help="pipeline TOML (default: the bundled sample config)")
    run.add_argument("--out", help=f"run directory (default: {DEFAULT_RUN})")
    run.add_argument("--until", help="stop after this stage")
    run.add_argument("--change-stages", action="store_true",
                     help="the config's stage list differs from the run directory's: move the other list's stage directories aside "
                          "(to RUN.replaced-TIME) instead of refusing")
    run.add_argument("--workers", type=int, help="worker processes per stage (default: all cores)")
    add_set_option(run)
    add_runner_options(run)
    run.set_defaults(func=cmd_run)

    rerun = sub.add_parser("rerun", help="re-run one stage of a run (and what follows it if its output changed)")
    rerun.add_argument("run", help="run directory written by `hymo run`")
    rerun.add_argument("--stage", required=True, help="the stage to re-run (its name, e.g. quality; `hymo manifest show RUN` lists them)")
    rerun.add_argument("--force", action="store_true", help="recompute the stage even if its published output is intact")
    rerun.add_argument("--until", help="stop after this stage (`--until shards`: refresh the corpus, train nothing)")
    add_set_option(rerun, "change one value of the run's saved config (config.json) before re-running, e.g. "
                          "--set quality.min_words=100; checked as `run --set` is, and recorded in config.json")
    add_runner_options(rerun)
    rerun.set_defaults(func=cmd_rerun)

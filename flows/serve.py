"""`hymo serve`: a Prefect server (started if none answers) plus the deployments the UI triggers.

Ctrl-C stops serving first, then the server it started: no run is left claimed by a dead runner.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from flows.server import DEFAULT_HOME, prefect_api

DEPLOYMENTS = ("hymo-pipeline/full", "hymo-stage/rerun", "hymo-train/train", "hymo-cpt/cpt")


def build_deployments(run_root: str, config_path: str | None = None) -> list:
    from flows.config import load_config
    from flows.cpt_flow import hymo_cpt
    from flows.pipeline import hymo_pipeline
    from flows.stage_flow import hymo_stage
    from flows.train_flow import hymo_train

    pipeline_defaults = {"out": f"{run_root}/sample"}
    if config_path:
        pipeline_defaults["config"] = load_config(config_path).model_dump(mode="json")
    return [
        hymo_pipeline.to_deployment(
            "full", parameters=pipeline_defaults,
            description="The whole HyMo DAG; the form's defaults run the bundled real sample."),
        hymo_stage.to_deployment(
            "rerun", parameters={"run": f"{run_root}/sample"},
            description="Re-run one stage of an existing run directory, and what follows it if its output changed."),
        hymo_train.to_deployment(
            "train", parameters={"corpus": f"{run_root}/sample"},
            description="Pretrain on a run's corpus manifest."),
        hymo_cpt.to_deployment(
            "cpt", parameters={"general": f"{run_root}/sample"},
            description="Continue a checkpoint on a domain corpus with general replay; the verdict comes from a gate written before training."),
    ]


def serve(api_url: str | None, home: Path, port: int, run_root: str, limit: int | None, config_path: str | None = None) -> int:
    from prefect import serve as prefect_serve

    with prefect_api(api_url, home=home, port=port) as (api, ui):
        print(f"Prefect API: {api}\nPrefect UI:  {ui}\nDeployments: {', '.join(DEPLOYMENTS)}\nCtrl-C to stop.", flush=True)
        try:
            prefect_serve(*build_deployments(run_root, config_path), limit=limit, print_starting_message=False)
        except KeyboardInterrupt:
            pass
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    return serve(args.api_url, Path(args.home), args.port, args.run_root, args.limit, args.config)


def add_commands(sub) -> None:
    parser = sub.add_parser("serve", help="start a local Prefect server (if none answers) and serve the HyMo deployments")
    parser.add_argument("--api-url", help="use this Prefect API if it answers (default: $PREFECT_API_URL)")
    parser.add_argument("--home", default=str(DEFAULT_HOME), help=f"where a started server keeps its SQLite database (default: {DEFAULT_HOME})")
    parser.add_argument("--port", type=int, default=4200,
                        help="port of a started server when neither --api-url nor $PREFECT_API_URL names one (default: 4200)")
    parser.add_argument("--run-root", default="runs", help="directory the deployments' default run directories live in")
    parser.add_argument("--limit", type=int, default=1, help="flow runs executed at once")
    parser.add_argument("--config", help="pipeline TOML whose values become the defaults of the hymo-pipeline/full form")
    parser.set_defaults(func=cmd_serve)

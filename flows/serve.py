"""`hymo serve`: a Prefect server (started if none answers) plus the deployments the UI triggers.

The `hymo-pipeline/full` form's defaults are `hymo run`'s with the same arguments: the config
`load_config` gives (the bundled sample config, or `--config`), written into the deployment field
by field, and an absolute run directory (`--run-root`, default $HYMO_HOME/runs, then `sample`), so
a run started from the UI lands where `hymo run` wrote and finds every stage Cached.
Ctrl-C stops serving first, then the server it started: no run is left claimed by a dead runner.
SIGUSR1 prints every thread's stack to stderr (serving goes on).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from flows.server import PREFECT_DIR, prefect_api

DEPLOYMENTS = ("hymo-pipeline/full", "hymo-stage/rerun", "hymo-train/train", "hymo-cpt/cpt", "hymo-ablate/ablate")


def pipeline_defaults(run_root: str | Path, config_path: str | None = None, overrides: list[str] | None = None) -> dict:
    """The `hymo-pipeline/full` form's values where they are not the flow's own defaults (those are `hymo run`'s already):
    the config of `hymo run [--config PATH]`, and the absolute run directory RUN_ROOT/sample."""
    from flows.config import SAMPLE_RUN, load_config

    return {"config": load_config(config_path, overrides).model_dump(mode="json"), "out": str(Path(run_root).resolve() / SAMPLE_RUN)}


def build_deployments(run_root: str | Path, config_path: str | None = None, overrides: list[str] | None = None) -> list:
    from flows.ablate_flow import hymo_ablate
    from flows.ablate_spec import SAMPLE_SPEC
    from flows.config import SAMPLE_CONFIG
    from flows.cpt_flow import hymo_cpt
    from flows.pipeline import hymo_pipeline
    from flows.stage_flow import hymo_stage
    from flows.train_flow import hymo_train

    defaults = pipeline_defaults(run_root, config_path, overrides)
    run = defaults["out"]
    return [
        hymo_pipeline.to_deployment(
            "full", parameters=defaults,
            description=(f"The whole HyMo DAG. The form's defaults are `hymo run`'s: the config {config_path or SAMPLE_CONFIG} "
                         f"into {run}. A config with another stage list fails unless change_stages is on.")),
        hymo_stage.to_deployment(
            "rerun", parameters={"run": run},
            description="Re-run one stage of an existing run directory, and what follows it if its output changed."),
        hymo_train.to_deployment(
            "train", parameters={"corpus": run},
            description="Pretrain on a run's corpus manifest."),
        hymo_cpt.to_deployment(
            "cpt", parameters={"general": run},
            description="Continue a checkpoint on a domain corpus with general replay; the verdict comes from a gate written before training."),
        hymo_ablate.to_deployment(
            "ablate", parameters={"spec": str(SAMPLE_SPEC), "out": str(Path(run_root).resolve() / "ablate-sample"), "base_run": run},
            description=("Proxy runs of an ablation spec's variants x seeds over the base run's cached stages, then a verdict per variant "
                         f"from the rule the spec fixed (default: {SAMPLE_SPEC.name}, the sample's prose-vs-web and MoE ablations).")),
    ]


def dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 PID` prints every thread's stack to stderr and serving goes on: what a long-lived `hymo serve`
    that does not stop on Ctrl-C is waiting for, without a debugger on the host."""
    import faulthandler
    import signal

    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def serve(api_url: str | None, home: Path | None, port: int, run_root: str | Path, limit: int | None, config_path: str | None = None,
          overrides: list[str] | None = None) -> int:
    from prefect import serve as prefect_serve

    dump_stacks_on_sigusr1()
    run_root = Path(run_root).resolve()
    with prefect_api(api_url, home=home, port=port) as (api, ui):
        print(f"Prefect API: {api}\nPrefect UI:  {ui}\nDeployments: {', '.join(DEPLOYMENTS)}\nRuns:        {run_root}\nCtrl-C to stop.",
              flush=True)
        try:
            prefect_serve(*build_deployments(run_root, config_path, overrides), limit=limit, print_starting_message=False)
        except KeyboardInterrupt:
            pass
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from flows.config import default_run_root

    return serve(args.api_url, Path(args.home) if args.home else None, args.port, args.run_root or default_run_root(), args.limit, args.config, args.set)


def add_commands(sub) -> None:
    parser = sub.add_parser("serve", help="start a local Prefect server (if none answers) and serve the HyMo deployments")
    parser.add_argument("--api-url", help="use this Prefect API if it answers (default: $PREFECT_API_URL)")
    parser.add_argument("--home", help=f"where a started server keeps its SQLite database (default: $HYMO_HOME/{PREFECT_DIR}, HYMO_HOME being "
                                         "the current directory when unset)")
    parser.add_argument("--port", type=int, default=4200,
                        help="port of a started server when neither --api-url nor $PREFECT_API_URL names one (default: 4200)")
    parser.add_argument("--run-root", help="directory the deployments' default run directory (RUN_ROOT/sample) lives in "
                                               "(default: $HYMO_HOME/runs, HYMO_HOME being the current directory when unset)")
    parser.add_argument("--limit", type=int, default=1, help="flow runs executed at once")
    parser.add_argument("--config", help="pipeline TOML whose values become the defaults of the hymo-pipeline/full form")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one value of that config in the form's defaults, e.g. --set pretrain.train.max_steps=50 (repeatable)")
    parser.set_defaults(func=cmd_serve)

"""The `hymo-cpt` flow: `hymo cpt` from the Prefect UI (deployment `hymo-cpt/cpt` in `hymo serve`)."""
from __future__ import annotations

import json
import os
from typing import Any

from prefect import flow, get_run_logger

from hymo_core.cpt.run import CptConfig, run_cpt, verdict_lines
from hymo_core.cpt.gate import Criterion


def record_hashes(record: dict[str, Any]) -> None:
    """The run's hashes at start and end, into the Prefect run log and an artifact: both live in the
    Prefect server, outside OUT, so `hymo cpt verify` has a record that editing OUT does not change."""
    from prefect.artifacts import create_table_artifact

    get_run_logger().info("cpt %s hashes: %s", record["stage"], json.dumps(record, sort_keys=True))
    create_table_artifact(key=f"hymo-cpt-{record['stage']}", table=[{"field": k, "value": str(v)} for k, v in sorted(record.items())],
                          description=f"hymo cpt {record['stage']} record of {record['run']}")


def artifact_records(run_id: str, api_url: str | None = None) -> dict[str, list[dict[str, str]]] | None:
    """Every hymo-cpt start/end artifact (all versions) whose record names `run_id`, by stage; None when no
    Prefect server answers at `api_url` / $PREFECT_API_URL (verify then skips this cross-check)."""
    from flows.server import api_healthy

    url = api_url or os.environ.get("PREFECT_API_URL")
    if not url or not api_healthy(url):
        return None
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    keys = ArtifactFilter(key=ArtifactFilterKey(any_=["hymo-cpt-start", "hymo-cpt-end"]))
    found: dict[str, list[dict[str, str]]] = {"start": [], "end": []}
    with get_client(sync_client=True) as client:
        offset = 0
        while page := client.read_artifacts(artifact_filter=keys, offset=offset, limit=200):
            offset += len(page)
            for artifact in page:
                rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
                fields = {row["field"]: row["value"] for row in rows or []}
                if fields.get("run_id") == run_id and fields.get("stage") in found:
                    found[fields["stage"]].append(fields)
    return found


@flow(name="hymo-cpt", log_prints=True)
def hymo_cpt(base: str, domain: str, general: str, out: str, replay_ratio: float = 0.3, peak_lr: float = 4e-4, steps: int = 100,
             warmup_steps: int = 10, min_lr_ratio: float = 0.1, eval_interval: int = 20, eval_batches: int = 10,
             gate: str | None = None, domain_reduction: float = 1.0, general_rise: float = 0.2) -> dict[str, Any]:
    """Continue `base` on `domain` with replay from `general`; `gate`: a gate.toml, else the two loss thresholds."""
    logger = get_run_logger()
    config = CptConfig(replay_ratio=replay_ratio, peak_lr=peak_lr, steps=steps, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
                       eval_interval=eval_interval, eval_batches=eval_batches)
    criteria = gate or [Criterion("domain_loss_reduction", ">=", domain_reduction), Criterion("general_loss_rise", "<=", general_rise)]
    summary = run_cpt(base, domain, general, out, config, criteria, log=logger.info, on_record=record_hashes)
    for line in verdict_lines(summary):
        logger.info(line)
    return summary

"""The pipeline under a real Prefect server: deployments triggered as the UI does, retry after a
failure, stale-cache protection, config changes, and the Dask runner."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import PROSE

from flows.config import load_config
from flows.pipeline import Runner, hymo_pipeline
from flows.stages import stage_path
from manifests.run_dir import completed_stages

from prefect_runs import create_from_deployment, task_states, wait_for_flow_run

pytestmark = pytest.mark.usefixtures("prefect_harness")


def digests(run: Path) -> dict[str, dict[str, str]]:
    """Every published output file's sha256, per stage: the bytes a run produced.

    Pretraining is compared by its checkpoints' bytes (the trainer's RNG is its own, not the process-global
    one Prefect's threads draw from) and final weights: its logs carry wall-clock throughput.
    """
    found = {s.stage: {o.path: o.sha256 for o in m.outputs if s.stage != "pretrain" or o.path.endswith(".pt")}
             for s, m in completed_stages(run)}
    summary = stage_path(run, "pretrain") / "summary.json"
    if summary.exists():
        found.setdefault("pretrain", {})["weights_sha256"] = json.loads(summary.read_text())["weights_sha256"]
    return found


REFERENCE_FLOW_RUN: list = []


@pytest.fixture(scope="module")
def reference_run(served) -> Path:
    """The served deployment's default run, triggered through the API exactly as the UI does."""
    flow_run = create_from_deployment()
    finished = wait_for_flow_run(flow_run.id)
    assert finished.state.is_completed(), served["log"].read_text(errors="replace")[-3000:]
    REFERENCE_FLOW_RUN[:] = [flow_run.id]
    return Path(served["run_root"]) / "sample"


def test_deployment_run_completes_with_readable_artifacts(reference_run: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    def artifacts(key: str):
        only_this_run = ArtifactFilterFlowRunId(any_=REFERENCE_FLOW_RUN)
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]), flow_run_id=only_this_run))

    with get_client(sync_client=True) as client:
        summary = artifacts("hymo-run-summary")
        counts = artifacts("hymo-dedup-fuzzy-counts")
    assert summary and "| dedup_fuzzy |" in summary[0].data and "data:image/png;base64," in summary[0].data
    rows = json.loads(counts[0].data) if isinstance(counts[0].data, str) else counts[0].data
    assert any(r["measure"] == "removed" and r["rule"] == "near_duplicate" and r["documents"] >= 1 for r in rows)
    assert (reference_run / "funnel.png").stat().st_size > 1000
    assert set(digests(reference_run)) >= {"ingest", "extract", "dedup_exact", "dedup_fuzzy", "decontam", "split", "tokenizer", "mixture", "shards"}


def test_failed_stage_retried_like_the_ui_recomputes_only_from_there(reference_run: Path, tmp_path: Path, tiny_config: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import AwaitingRetry

    config = load_config(tiny_config).model_dump(mode="json")
    benchmark = tmp_path / "late-benchmark.jsonl.gz"
    config["decontam"]["benchmarks"] = ["humaneval", str(benchmark)]
    flow_run = create_from_deployment({"config": config, "out": str(tmp_path / "run")})
    failed = wait_for_flow_run(flow_run.id)
    assert failed.state.is_failed()
    assert not (stage_path(tmp_path / "run", "decontam") / "manifest.json").exists()
    first_attempt = task_states(flow_run.id)
    assert first_attempt["dedup_fuzzy"] == ["Completed"] and first_attempt["decontam"] == ["Failed"]

    with gzip.open(benchmark, "wt", encoding="utf-8") as handle:  # the fix: the benchmark file now exists
        handle.write(json.dumps({"id": "q1", "text": PROSE[0]}) + "\n")
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run.id, AwaitingRetry(), force=True)  # what the UI's Retry button sends
    retried = wait_for_flow_run(flow_run.id)
    assert retried.state.is_completed() and retried.run_count == 2
    states = task_states(flow_run.id)
    for stage in ("ingest", "extract", "dedup_exact", "dedup_fuzzy"):
        assert states[stage][-1] == "Cached", (stage, states[stage])
    assert states["decontam"][-1] == "Completed" and states["split"][-1] == "Completed"

    # Same bytes as an uninterrupted run of the same deployment with the same configuration.
    clean = wait_for_flow_run(create_from_deployment({"config": config, "out": str(tmp_path / "clean")}).id)
    assert clean.state.is_completed()
    assert digests(tmp_path / "run") == digests(tmp_path / "clean")


def test_deleted_output_is_recomputed_not_served_stale(reference_run: Path, tmp_path: Path, tiny_config: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(reference_run, run)
    before = digests(run)
    (stage_path(run, "split") / "data" / "part-00000.parquet").unlink()
    result = hymo_pipeline(config=load_config(tiny_config), out=str(run), return_state=True)
    assert result.is_completed()
    assert digests(run) == before
    states = task_states(result.state_details.flow_run_id)
    assert states["decontam"] == ["Cached"] and states["split"] == ["Completed"]


def test_config_change_recomputes_that_stage_and_downstream_only(reference_run: Path, tmp_path: Path, tiny_config: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(reference_run, run)
    before = digests(run)
    config = load_config(tiny_config)
    config = config.model_copy(update={"split": type(config.split)(**{**config.split.__dict__, "seed": 99})})
    result = hymo_pipeline(config=config, out=str(run), return_state=True)
    states = task_states(result.state_details.flow_run_id)
    assert all(states[s] == ["Cached"] for s in ("ingest", "extract", "dedup_exact", "dedup_fuzzy", "decontam"))
    assert states["split"] == ["Completed"] and states["tokenizer"] == ["Completed"]
    after = digests(run)
    assert all(after[s] == before[s] for s in ("ingest", "extract", "dedup_exact", "dedup_fuzzy", "decontam"))
    assert after["split"] != before["split"]


def test_dask_runner_gives_the_same_bytes(reference_run: Path, tmp_path: Path, tiny_config: Path) -> None:
    hymo_pipeline(config=load_config(tiny_config), out=str(tmp_path / "dask"), runner=Runner.dask)
    assert digests(tmp_path / "dask") == digests(reference_run)


@pytest.mark.parametrize("workers", [3, 1])
def test_dask_cluster_size_does_not_change_the_data_stages_bytes(reference_run: Path, tmp_path: Path, tiny_config: Path, workers: int) -> None:
    """Global passes (hashing, signatures, n-gram scans) run as Dask tasks too; 3 worker processes or 1 give the same bytes."""
    config = load_config(tiny_config).model_copy(update={"workers": workers})
    hymo_pipeline(config=config, out=str(tmp_path / "dask"), until="decontam", runner=Runner.dask)
    found, reference = digests(tmp_path / "dask"), digests(reference_run)
    assert "dedup_fuzzy" in found and "decontam" in found and found == {stage: reference[stage] for stage in found}

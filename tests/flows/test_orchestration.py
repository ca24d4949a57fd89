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

from cluster_machines import api_call, free_port, machine, recipe_exports, recipe_line, wait_until
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
    """Same bytes, checkpoints included: the training stage on the flow host chooses its threads as it would
    without Dask (a local cluster's nannies write OMP_NUM_THREADS=1 into the host's environment), and each
    stage manifest says which runner, workers and threads made it."""
    hymo_pipeline(config=load_config(tiny_config), out=str(tmp_path / "dask"), runner=Runner.dask)
    assert digests(tmp_path / "dask") == digests(reference_run)
    for run, runner in ((reference_run, "process"), (tmp_path / "dask", "dask")):
        manifest = json.loads((stage_path(run, "ingest") / "manifest.json").read_text())
        parallelism = manifest["extra"]["parallelism"]
        assert parallelism["runner"] == runner and parallelism["workers"] >= 1 and parallelism["threads_per_worker"] >= 1
    summary = json.loads((stage_path(tmp_path / "dask", "pretrain") / "summary.json").read_text())
    assert summary["threads"]["source"] != "OMP_NUM_THREADS"


@pytest.mark.parametrize("workers", [3, 1])
def test_dask_cluster_size_does_not_change_the_data_stages_bytes(reference_run: Path, tmp_path: Path, tiny_config: Path, workers: int) -> None:
    """Global passes (hashing, signatures, n-gram scans) run as Dask tasks too; 3 worker processes or 1 give the same bytes."""
    config = load_config(tiny_config).model_copy(update={"workers": workers})
    hymo_pipeline(config=config, out=str(tmp_path / "dask"), until="decontam", runner=Runner.dask)
    found, reference = digests(tmp_path / "dask"), digests(reference_run)
    assert "dedup_fuzzy" in found and "decontam" in found and found == {stage: reference[stage] for stage in found}


DATA_HALF = {"ingest", "extract", "langid", "quality", "pii", "dedup_exact", "dedup_fuzzy", "decontam", "split", "tokenizer", "mixture", "shards"}


def test_the_cluster_recipe_gives_the_process_runners_bytes(reference_run: Path, tmp_path: Path, tiny_config: Path, capsys) -> None:
    """infra/README.md's recipe on a simulated cluster: a Prefect server with basic auth on its own port, `dask scheduler`,
    two `dask worker`s, each in its own empty working directory, HOME and TMPDIR; only the run directory is shared (the
    flow host's working directory, where the relative --out resolves). The flow is killed mid-run and run again, and a
    worker kills itself in the middle of dedup_fuzzy: the data half still has the process runner's bytes."""
    from distributed import Client

    from flows.cli import main
    from flows.server import api_healthy

    auth = "hymo:cluster-test-secret"
    api_port, scheduler_port = free_port(), free_port()
    values = {"hymo:CHANGE-ME": auth, "0.0.0.0": "127.0.0.1", "4300": str(api_port), "8786": str(scheduler_port), "PREFECT_HOST": "127.0.0.1",
              "SCHEDULER": "127.0.0.1", "--nworkers 8": "--nworkers 1", "/shared/hymo/runs/big": "runs/big"}
    exports = recipe_exports(values)
    api_url = exports["PREFECT_API_URL"]
    server = machine(tmp_path, "server", PREFECT_SERVER_API_AUTH_STRING=exports["PREFECT_SERVER_API_AUTH_STRING"])
    scheduler = machine(tmp_path, "scheduler")
    workers = [machine(tmp_path, f"worker{i}") for i in range(2)]  # neither Prefect variable: tasks carry the flow's settings
    flow = machine(tmp_path, "flow", PREFECT_API_URL=api_url, PREFECT_API_AUTH_STRING=exports["PREFECT_API_AUTH_STRING"])
    faults = Path(__file__).with_name("cluster_faults.py")
    run = flow.cwd / "runs" / "big"
    command = [*recipe_line("hymo run", values), "--config", str(tiny_config), "--until", "shards"]
    try:
        alive = [(server.start(recipe_line("prefect server start", values), "server.log"), server, "server.log"),
                 (scheduler.start(recipe_line("dask scheduler", values), "scheduler.log"), scheduler, "scheduler.log")]
        alive += [(w.start([*recipe_line("dask worker", values), "--preload", str(faults)], "worker.log"), w, "worker.log") for w in workers]
        wait_until(lambda: api_healthy(api_url), "the Prefect server", 240, alive)
        with Client(f"tcp://127.0.0.1:{scheduler_port}", timeout=120) as client:
            client.wait_for_workers(2, timeout=120)
        assert api_call(api_url, "/flows/filter", {}, None)[0] == 401  # a client without the auth string is refused
        assert api_call(api_url, "/flows/filter", {}, "hymo:wrong")[0] == 401
        assert api_call(api_url, "/flows/filter", {}, auth)[0] == 200
        assert main(["run", "--api-url", api_url, "--out", str(tmp_path / "refused")]) == 1  # so is `hymo run`, in one line, at once
        assert "refuses this client (401): set PREFECT_API_AUTH_STRING" in capsys.readouterr().err
        assert not (tmp_path / "refused").exists()

        first = flow.start(command, "run-1.log")  # killed once langid is published
        wait_until(lambda: any(run.glob("*_langid/manifest.json")), "langid's manifest", 300, [(first, flow, "run-1.log")])
        first.kill()
        first.wait()
        second = flow.start(command, "run-2.log")
        assert second.wait(timeout=600) == 0, flow.log("run-2.log")
        status, batches = api_call(api_url, "/task_runs/filter", {"task_runs": {"name": {"like_": "dedup_fuzzy-shards-"}}}, auth)
        assert status == 200 and batches and all(b["state_type"] == "COMPLETED" for b in batches)  # the workers reported them
    finally:
        for owner in (flow, *workers, scheduler, server):
            owner.stop()
    found = digests(run)
    assert set(found) == DATA_HALF and found == {stage: digests(reference_run)[stage] for stage in found}
    assert [p.name for p in run.glob("*/killed-a-worker-in-signatures")] == ["killed-a-worker-in-signatures"]  # the fault did happen
    for owner in (*workers, scheduler):  # nothing resolved against a worker's own working directory
        assert not list(owner.cwd.iterdir()), f"{owner.root.name} wrote into its working directory: {list(owner.cwd.iterdir())}"


def test_a_cluster_run_without_an_api_the_workers_reach_fails_at_once(tmp_path: Path, monkeypatch, capsys) -> None:
    from flows.cli import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    cases = {(): "set PREFECT_API_URL", ("--api-url", "http://127.0.0.1:4200/api"): "loopback address"}
    for extra, message in cases.items():
        assert main(["run", "--runner", "dask", "--dask-address", "tcp://10.20.30.40:8786", "--out", str(tmp_path / "run"), *extra]) == 1
        error = capsys.readouterr().err.strip()
        assert message in error and error.count("\n") == 0 and not (tmp_path / "run").exists()


def test_a_data_stage_rerun_alone_on_dask_gets_the_cluster() -> None:
    """`hymo rerun --stage S --until S --runner dask` of a stage without shard batches (ingest, extract, tokenizer, mixture,
    shards) still runs its per-shard passes on the cluster: it gets the task runner (whose client they use); the process
    runner keeps its own pools for them, and pretraining alone needs no runner."""
    from flows.pipeline import needs_task_runner
    from flows.stages import STAGE_BY_NAME

    alone = {name: [STAGE_BY_NAME[name]] for name in ("ingest", "extract", "langid", "tokenizer", "mixture", "shards", "pretrain")}
    assert [n for n, e in alone.items() if needs_task_runner(e, Runner.dask)] == ["ingest", "extract", "langid", "tokenizer", "mixture", "shards"]
    assert [n for n, e in alone.items() if needs_task_runner(e, Runner.process)] == ["langid"]

"""The flow as Prefect users expect it, checked through the Prefect API of a real server: the 13 stages
as a chain of task runs with shard batches nested under their stage, Prefect's own Cached state and
refresh_cache keyed by the stage contract, link artifacts to the audit logs, progress artifacts, and
training loss in the run log and a live artifact."""
from __future__ import annotations

import gc

import json
from pathlib import Path

import pytest

from flows.config import load_config
from flows.pipeline import hymo_pipeline
from flows.stage_flow import hymo_stage
from flows.stages import pipeline_stages, previous_stage_path, stage_path
from manifests.stage_manifest import read_manifest
from prefect_runs import task_runs

pytestmark = pytest.mark.usefixtures("prefect_harness")


def flow_artifacts(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


def run_log(flow_run_id) -> list[str]:
    """Every log message of a flow run, oldest first (the API hands out 200 at a time)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    messages: list[str] = []
    with get_client(sync_client=True) as client:
        while page := client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200, offset=len(messages)):
            messages += [log.message for log in page]
    return messages


def stage_runs(runs: list, names: list[str]) -> dict:
    return {r.name: r for r in runs if r.name in names}


@pytest.fixture(scope="module")
def names(tiny_config: Path) -> list[str]:
    """The stages of the tiny config, in order (13: no optional stage, no user filter)."""
    return [entry.name for entry in pipeline_stages(load_config(str(tiny_config)))]


# What the first run sent to the process runner's pool: Prefect task runs, and shard jobs as plain calls.
FIRST_RUN_SUBMITS: dict[str, int] = {}
FROZEN_AT_SUBMIT: list[int] = []  # objects the collector's passes left out, in the flow host, at each shard job sent; then after the flow


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_config: Path, monkeypatch_module) -> tuple[Path, object]:
    from concurrent.futures import ProcessPoolExecutor

    from prefect.task_runners import ProcessPoolTaskRunner

    from tasks.runner.stage_runner import _run_one_shard

    calls = {"task runs": 0, "shard jobs": 0}
    submit_task_run, submit_call = ProcessPoolTaskRunner.submit, ProcessPoolExecutor.submit

    def count_task_run(self, *args, **kwargs):
        calls["task runs"] += 1
        return submit_task_run(self, *args, **kwargs)

    def count_call(self, fn, *args, **kwargs):
        calls["shard jobs"] += fn is _run_one_shard
        if fn is _run_one_shard:
            FROZEN_AT_SUBMIT.append(gc.get_freeze_count())
        return submit_call(self, fn, *args, **kwargs)

    monkeypatch_module.setattr(ProcessPoolTaskRunner, "submit", count_task_run)
    monkeypatch_module.setattr(ProcessPoolExecutor, "submit", count_call)
    monkeypatch_module.setenv("HYMO_PROGRESS_AFTER_S", "0")  # every stage shows progress, however short
    run = tmp_path_factory.mktemp("conventions") / "run"
    state = hymo_pipeline(config=load_config(str(tiny_config)), out=str(run), return_state=True)
    assert state.is_completed()
    FIRST_RUN_SUBMITS.update(calls)
    FROZEN_AT_SUBMIT.append(gc.get_freeze_count())  # last: after the flow
    return run, state.state_details.flow_run_id


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_stages_form_a_chain_with_shard_batches_nested_under_their_stage(first_run, names: list[str]) -> None:
    _, flow_run_id = first_run
    runs = task_runs(flow_run_id)
    stages = stage_runs(runs, names)
    assert set(stages) == set(names) and len(names) == 13
    for before, after in zip(names, names[1:]):
        upstream = {i.id for i in stages[after].task_inputs.get("wait_for", [])}
        assert upstream == {stages[before].id}, (after, stages[after].task_inputs)
    batches = [r for r in runs if "-shards-" in r.name]
    assert {r.name.split("-shards-")[0] for r in batches} >= {"langid", "quality", "pii", "dedup_exact", "dedup_fuzzy", "decontam", "split"}
    for batch in batches:
        parents = {i.id for i in batch.task_inputs.get("__parents__", [])}
        assert parents == {stages[batch.name.split("-shards-")[0]].id}, batch.name


def test_shard_batches_are_task_runs_of_the_flow_whose_shards_run_as_calls_on_the_worker_pool(first_run, tiny_config: Path,
                                                                                             names: list[str]) -> None:
    """A batch submitted to the process pool as a Prefect task run carries the whole run context there (serialized
    here, validated again in the worker, a client of its own): 0.1-0.3 s of every document stage on a small corpus."""
    run, _ = first_run
    config = load_config(str(tiny_config))
    doc_stages = [entry.name for entry in pipeline_stages(config) if entry.doc_stage is not None]
    shards = {name: len(read_manifest(previous_stage_path(run, name, config), verify=False).files("data")) for name in doc_stages + ["extract"]}
    assert len(doc_stages) >= 7 and min(shards.values()) >= 2
    # Every document stage's input shards, and extract's (it maps its shards on the same pool from its own run).
    assert FIRST_RUN_SUBMITS == {"task runs": 0, "shard jobs": sum(shards.values())}


def test_the_flow_host_leaves_the_heap_it_started_with_out_of_full_collections_while_its_stages_run(first_run) -> None:
    """A full pass of the cyclic collector over the flow host's imports and Prefect's objects cost ~0.1 s, once between
    two rounds of dedup_fuzzy's global pass; frozen for the run (flows.pipeline.frozen_heap), given back after."""
    *during, after = FROZEN_AT_SUBMIT
    assert len(during) >= 10 and min(during) > 50_000  # this process's modules, pytest's and Prefect's, at every shard job sent
    assert after == 0


def test_second_run_is_cached_by_prefect_and_runs_no_shard_batch(first_run, tiny_config: Path, names: list[str]) -> None:
    run, _ = first_run
    before = {p: p.stat().st_mtime_ns for p in run.rglob("manifest.json")}
    state = hymo_pipeline(config=load_config(str(tiny_config)), out=str(run), return_state=True)
    runs = task_runs(state.state_details.flow_run_id)
    assert {name: r.state.name for name, r in stage_runs(runs, names).items()} == {name: "Cached" for name in names}
    assert not [r for r in runs if "-shards-" in r.name]
    keys = {a.key for a in flow_artifacts(state.state_details.flow_run_id)}
    # No stage did work, so none re-read its audit log for samples; the data report page is linked at every flow's end.
    assert keys == {"hymo-run-summary", "hymo-data-report"}
    assert {p: p.stat().st_mtime_ns for p in run.rglob("manifest.json")} == before


def test_refresh_cache_recomputes_that_stage_and_later_stages_stay_cached(first_run, names: list[str]) -> None:
    run, _ = first_run
    split_manifest = stage_path(run, "split") / "manifest.json"
    before = json.loads(split_manifest.read_text())
    stamp = split_manifest.stat().st_ino
    state = hymo_stage(run=str(run), stage="split", force=True, until="tokenizer", return_state=True)
    states = {name: r.state.name for name, r in stage_runs(task_runs(state.state_details.flow_run_id), names).items()}
    assert states == {"split": "Completed", "tokenizer": "Cached"}
    assert split_manifest.stat().st_ino != stamp  # republished...
    assert json.loads(split_manifest.read_text())["digest"] == before["digest"]  # ...with the same bytes


def test_audit_logs_are_link_artifacts_and_long_work_shows_progress(first_run) -> None:
    run, flow_run_id = first_run
    artifacts = flow_artifacts(flow_run_id)
    links = [a for a in artifacts if a.key and a.key.endswith("-audit")]  # Prefect stores a link artifact as markdown
    assert {a.key for a in links} >= {"hymo-extract-audit", "hymo-dedup-fuzzy-audit"}
    for artifact in links:
        stage = artifact.key.removeprefix("hymo-").removesuffix("-audit").replace("-", "_")
        audit_dir = stage_path(run, stage) / "audit"
        assert artifact.data == f"[{audit_dir.parent.name}/audit/]({audit_dir.resolve().as_uri()})"
    progress = {a.key: a.data for a in artifacts if a.type == "progress"}
    assert progress.get("hymo-pretrain-progress") == 100.0 and progress.get("hymo-dedup-fuzzy-progress") == 100.0


def test_long_stages_report_their_phases_to_the_run_log_and_a_progress_artifact(first_run) -> None:
    """Extraction counts documents (page by page inside a shard: tests/tasks/runner/test_stage_progress.py), the
    global passes and the tokenizer name each phase once in the run log; every progress artifact ends at 100 %."""
    _, flow_run_id = first_run
    phases: dict[str, list[str]] = {}
    for message in run_log(flow_run_id):
        stage, _, phase = message.partition(" phase: ")
        if phase:
            phases.setdefault(stage, []).append(phase.split(" (")[0])
    def named_once_in_order(stage: str, expected: list[str]) -> None:
        """Each expected phase is named exactly once, in this order (runner phases of new shard tasks may sit between)."""
        found = phases[stage]
        assert all(found.count(name) == 1 for name in expected), (stage, found)
        assert [name for name in found if name in expected] == expected, (stage, found)

    assert phases["extract"][0] == "documents"
    named_once_in_order("dedup_exact", ["exact digests"])  # the sample has no exact copies: no texts to read back
    named_once_in_order("dedup_fuzzy", ["minhash", "lsh buckets", "verify pairs", "clusters"])
    named_once_in_order("decontam", ["indexing benchmarks", "matching n-grams", "listing removals"])
    named_once_in_order("tokenizer", ["sampling documents", "training BPE", "round-trip check", "compression"])
    assert phases["pretrain"] == ["training steps"]
    progress = {a.key: (a.data, a.description) for a in flow_artifacts(flow_run_id) if a.type == "progress"}
    for stage in ("extract", "dedup-exact", "dedup-fuzzy", "decontam", "tokenizer"):
        assert progress[f"hymo-{stage}-progress"] == (100.0, f"{stage.replace('-', '_')}: done")


def test_training_loss_reaches_the_run_log_and_a_live_artifact(first_run) -> None:
    _, flow_run_id = first_run
    steps = [message for message in run_log(flow_run_id) if message.startswith("train step ")]
    assert [m.split()[2] for m in steps] == ["1/4", "2/4", "3/4", "4/4"]  # log_interval = 1 in the tiny config
    assert all(" loss " in m and " lr " in m and " tokens/s " in m for m in steps)
    training = [a for a in flow_artifacts(flow_run_id) if a.key == "hymo-pretrain-training"]
    assert training and "| 4 |" in training[-1].data and "validation loss" in training[-1].data


def test_a_stage_failing_once_with_a_transient_fault_is_retried_by_prefect_to_the_same_bytes(
        first_run, tiny_config: Path, tmp_path: Path, monkeypatch) -> None:
    """An I/O error in the middle of publishing pii (the injected fault, once) fails that attempt; Prefect's
    retry recomputes the stage and the run ends with the bytes of a run that never failed."""
    import errno
    import os

    from flows import pipeline

    real_publish, failed = pipeline.publish_plan, []

    def publish_failing_once(plan, results):
        def first_then_eio():
            yield results[0]
            failed.append(plan.writer.work_dir)
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(plan.writer.work_dir / "data"))
        return real_publish(plan, first_then_eio() if plan.stage.name == "pii" and not failed else results)

    monkeypatch.setattr(pipeline, "publish_plan", publish_failing_once)
    config = load_config(str(tiny_config)).model_copy(update={"task_retries": 1, "task_retry_delay_s": 0})
    run = tmp_path / "run"
    state = hymo_pipeline(config=config, out=str(run), until="pii", return_state=True)
    assert state.is_completed() and len(failed) == 1 and not failed[0].exists()
    [pii] = [r for r in task_runs(state.state_details.flow_run_id) if r.name == "pii"]
    assert pii.run_count == 2 and pii.state.name == "Completed"
    clean = json.loads((stage_path(first_run[0], "pii") / "manifest.json").read_text())
    retried = json.loads((stage_path(run, "pii") / "manifest.json").read_text())
    assert [(o["path"], o["sha256"]) for o in retried["outputs"]] == [(o["path"], o["sha256"]) for o in clean["outputs"]]
    assert not [p.name for p in run.iterdir() if p.name.endswith(".partial")]


def test_only_faults_a_retry_may_clear_are_retried() -> None:
    import errno
    from concurrent.futures.process import BrokenProcessPool

    from flows.errors import may_pass_on_retry
    from manifests.benchmark_sets import BenchmarkNotFound
    from manifests.stage_manifest import DigestMismatch
    from tasks.ingest.source_fs import InputFileError

    assert may_pass_on_retry(BrokenProcessPool("a worker died")) and may_pass_on_retry(OSError(errno.EIO, "I/O error"))
    assert may_pass_on_retry(ConnectionResetError(errno.ECONNRESET, "reset")) and may_pass_on_retry(TimeoutError())
    for user_error in (OSError(errno.ENOSPC, "No space left on device"), FileNotFoundError(errno.ENOENT, "gone"),
                       PermissionError(errno.EACCES, "denied"), ValueError("config: bad"), InputFileError("x.warc: truncated"),
                       DigestMismatch("changed"), BenchmarkNotFound("decontam: benchmark 'x' is not bundled"),
                       ConnectionError("http://prefect.invalid:4200/api does not answer")):
        assert not may_pass_on_retry(user_error), user_error


def test_each_stages_artifacts_hang_on_its_own_task_run(first_run, names: list[str]) -> None:
    """The UI's Artifacts tab of a stage's task run shows that stage's tables and audit link (read through the API by
    task run id), and stages that make files publish what they made, not an "in 0 / kept 0" table."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterTaskRunId

    from manifests.stage_manifest import read_manifest

    run, flow_run_id = first_run
    stages = stage_runs(task_runs(flow_run_id), names)
    with get_client(sync_client=True) as client:
        def of_task(stage: str) -> dict:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(task_run_id=ArtifactFilterTaskRunId(any_=[stages[stage].id])))
            return {a.key: a for a in found if a.key}

        for stage in ("extract", "dedup_fuzzy"):
            keys = set(of_task(stage))
            assert {f"hymo-{stage.replace('_', '-')}-counts", f"hymo-{stage.replace('_', '-')}-audit"} <= keys, (stage, keys)
        sampled = [a for a in flow_artifacts(flow_run_id) if a.key and a.key.endswith("-removed-samples")]
        assert sampled and all(a.task_run_id is not None for a in sampled)
        made = {}
        for stage in ("tokenizer", "mixture", "shards", "pretrain"):
            keys = of_task(stage)
            assert f"hymo-{stage}-counts" not in keys and f"hymo-{stage}-made" in keys, (stage, set(keys))
            made[stage] = {row["measure"]: row["value"] for row in json.loads(keys[f"hymo-{stage}-made"].data)}
    tokenizer = read_manifest(stage_path(run, "tokenizer")).extra["tokenizer"]
    assert made["tokenizer"]["vocabulary"] == tokenizer["vocab_size"]
    assert made["shards"]["train shards"] >= 1 and made["shards"]["train tokens"] > 0
    assert made["pretrain"]["steps"] == read_manifest(stage_path(run, "pretrain")).extra["final_step"]
    assert any(measure.startswith("tokens: ") for measure in made["mixture"])
    log = run_log(flow_run_id)
    for stage in ("tokenizer", "mixture", "shards", "pretrain"):
        line = next(m for m in log if m.startswith(f"{stage} computed: "))
        assert "in=" not in line and "kept=" not in line, line
    assert any(m.startswith("tokenizer computed: vocabulary ") for m in log)

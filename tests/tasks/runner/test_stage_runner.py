"""The plumbing: atomic publish, crash and re-run, digests, accounting, no-op re-runs."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from manifests.schema import docs_table
from manifests.stage_manifest import DigestMismatch, StageNotComplete, read_manifest
from tasks.runner import stage_runner
from tasks.runner.stage_runner import AccountingError, ShardOutcome, StageDef, StageWriter, run_stage


def make_input_stage(out: Path, shards: int = 3, per_shard: int = 4) -> Path:
    writer = StageWriter("ingest", "1", {}, "key", [], out)
    for s in range(shards):
        rows = [{"id": f"doc-{s}-{i}", "text": " ".join([f"text number {s * per_shard + i}"] * (i + 1)), "source": "t", "url": f"u{s}{i}", "meta": {}} for i in range(per_shard)]
        writer.write_shard(s, docs_table(rows), [])
    writer.publish()
    return out


@dataclass(frozen=True)
class DropOddConfig:
    min_words: int = 4
    fail_on_shard: str | None = None


def drop_short(docs: pa.Table, config: DropOddConfig, context: object) -> ShardOutcome:
    words = pc.list_value_length(pc.utf8_split_whitespace(docs.column("text")))
    keep = pc.greater_equal(words, config.min_words)
    if config.fail_on_shard and docs.num_rows and docs.column("id")[0].as_py().startswith(config.fail_on_shard):
        raise RuntimeError("injected crash in the middle of the stage")
    removed = docs.filter(pc.invert(keep))
    audit = [{"id": i, "action": "removed", "rule": "too_few_words", "value": w, "threshold": config.min_words, "detail": {}}
             for i, w in zip(removed.column("id").to_pylist(), pc.filter(words, pc.invert(keep)).to_pylist())]
    return ShardOutcome(docs.filter(keep), audit)


DROP = StageDef("drop_short", "1", drop_short)


def lose_one(docs: pa.Table, config: object, context: object) -> ShardOutcome:
    return ShardOutcome(docs.slice(1), [])


def file_bytes(stage_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(stage_dir).as_posix(): p.read_bytes() for p in sorted(stage_dir.rglob("*.parquet"))}


def test_stage_counts_and_audit(tmp_path: Path) -> None:
    upstream = make_input_stage(tmp_path / "01_ingest")
    manifest = run_stage(DROP, DropOddConfig(), upstream, tmp_path / "02_drop", workers=1)
    assert manifest.counts["in"] == 12
    # texts have 3, 6, 9 and 12 words: the 3-word one of each shard falls under min_words=4
    assert manifest.counts["removed"] == {"too_few_words": 3}
    assert manifest.counts["kept"] == 9
    audit = stage_runner.read_stage_audit(tmp_path / "02_drop").to_pylist()
    assert sorted(r["id"] for r in audit) == ["doc-0-0", "doc-1-0", "doc-2-0"]
    assert {(r["stage"], r["rule"], r["value"], r["threshold"]) for r in audit} == {("drop_short", "too_few_words", 3.0, 4.0)}
    assert manifest.shards == ["part-00000", "part-00001", "part-00002"]


def test_crash_mid_stage_publishes_nothing_and_rerun_is_byte_identical(tmp_path: Path) -> None:
    upstream = make_input_stage(tmp_path / "01_ingest")
    clean = run_stage(DROP, DropOddConfig(), upstream, tmp_path / "clean", workers=1)
    with pytest.raises(RuntimeError, match="injected crash"):
        run_stage(DROP, DropOddConfig(fail_on_shard="doc-1"), upstream, tmp_path / "crashed", workers=1)
    with pytest.raises(StageNotComplete):
        read_manifest(tmp_path / "crashed")
    rerun = run_stage(DROP, DropOddConfig(), upstream, tmp_path / "crashed", workers=1)
    assert file_bytes(tmp_path / "crashed") == file_bytes(tmp_path / "clean")
    assert rerun.digest == clean.digest


def test_crash_between_write_and_rename_leaves_no_complete_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = make_input_stage(tmp_path / "01_ingest")
    real_replace = os.replace

    def crash_on_publish(src, dst):
        if str(dst).endswith("02_drop"):
            raise OSError("power cut")
        return real_replace(src, dst)

    monkeypatch.setattr(stage_runner.os, "replace", crash_on_publish)
    with pytest.raises(OSError, match="power cut"):
        run_stage(DROP, DropOddConfig(), upstream, tmp_path / "02_drop", workers=1)
    monkeypatch.undo()
    with pytest.raises(StageNotComplete):
        read_manifest(tmp_path / "02_drop")
    assert not any(p.name == "02_drop" for p in tmp_path.iterdir())


def test_digest_verified_on_read(tmp_path: Path) -> None:
    upstream = make_input_stage(tmp_path / "01_ingest")
    run_stage(DROP, DropOddConfig(), upstream, tmp_path / "02_drop", workers=1)
    victim = tmp_path / "02_drop" / "data" / "part-00001.parquet"
    victim.write_bytes(victim.read_bytes()[:-9] + b"corrupted")
    with pytest.raises(DigestMismatch, match="part-00001.parquet"):
        read_manifest(tmp_path / "02_drop")


def test_manifest_without_complete_flag_is_refused(tmp_path: Path) -> None:
    stage = make_input_stage(tmp_path / "01_ingest")
    raw = json.loads((stage / "manifest.json").read_text())
    raw["complete"] = False
    (stage / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(StageNotComplete):
        read_manifest(stage)


def test_same_key_rerun_is_a_noop_and_config_change_recomputes(tmp_path: Path) -> None:
    upstream = make_input_stage(tmp_path / "01_ingest")
    first = run_stage(DROP, DropOddConfig(), upstream, tmp_path / "02_drop", workers=1)
    mtime = (tmp_path / "02_drop" / "manifest.json").stat().st_mtime_ns
    second = run_stage(DROP, DropOddConfig(), upstream, tmp_path / "02_drop", workers=1)
    assert (tmp_path / "02_drop" / "manifest.json").stat().st_mtime_ns == mtime
    assert second.digest == first.digest
    third = run_stage(DROP, DropOddConfig(min_words=1), upstream, tmp_path / "02_drop", workers=1)
    assert third.cache_key != first.cache_key
    assert third.counts["kept"] == 12


def test_stage_that_loses_a_document_is_refused(tmp_path: Path) -> None:
    upstream = make_input_stage(tmp_path / "01_ingest")
    with pytest.raises(AccountingError, match="4 documents in, 3 kept"):
        run_stage(StageDef("lossy", "1", lose_one), None, upstream, tmp_path / "02_lossy", workers=1)
    with pytest.raises(StageNotComplete):
        read_manifest(tmp_path / "02_lossy")


def test_worker_processes_give_the_same_bytes(tmp_path: Path) -> None:
    upstream = make_input_stage(tmp_path / "01_ingest")
    run_stage(DROP, DropOddConfig(), upstream, tmp_path / "serial", workers=1)
    run_stage(DROP, DropOddConfig(), upstream, tmp_path / "parallel", workers=2)
    assert file_bytes(tmp_path / "serial") == file_bytes(tmp_path / "parallel")


def test_a_shard_is_fed_in_bounded_batches_with_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage functions never see a whole shard at once, and how it is cut does not show in the output."""
    upstream = make_input_stage(tmp_path / "01_ingest", shards=2, per_shard=9)
    whole = run_stage(DROP, DropOddConfig(), upstream, tmp_path / "whole", workers=1)
    seen: list[int] = []

    def counting(docs: pa.Table, config: DropOddConfig, context: object) -> ShardOutcome:
        seen.append(docs.num_rows)
        return drop_short(docs, config, context)

    monkeypatch.setattr(stage_runner, "SHARD_BATCH_DOCS", 4)
    batched = run_stage(StageDef("drop_short", "1", counting), DropOddConfig(), upstream, tmp_path / "batched", workers=1)
    assert seen == [4, 4, 1, 4, 4, 1]
    assert file_bytes(tmp_path / "batched") == file_bytes(tmp_path / "whole")
    assert batched.counts == whole.counts


def test_host_traffic_counts_jobs_and_results_of_every_map():
    from tasks.runner.host_traffic import count_host_traffic
    from tasks.runner.stage_runner import map_shards

    with count_host_traffic() as traffic:
        results = list(map_shards(_double, [(1,), (2,), (3,)], 1, "double", [1, 1, 1]))
    assert results == [2, 4, 6]
    assert traffic.jobs["double"] == 3 and traffic.result_bytes["double"] > 0 and traffic.job_bytes["double"] > 0
    assert list(map_shards(_double, [(4,)], 1, "outside", [1])) == [8]
    assert "outside" not in traffic.jobs


def _double(value: int) -> int:
    return 2 * value


def _pid() -> int:
    return os.getpid()


def lent_pool_with_a_dead_worker():
    """A 2-worker pool of the flow's kind, both workers started, one of them SIGKILLed while idle."""
    import signal
    import time
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from tasks.runner.worker_threads import worker_choice, worker_environment

    pool = ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn"), initializer=stage_runner.start_worker,
                               initargs=(os.getpid(), worker_environment(worker_choice(2))))
    for future in [pool.submit(_pid) for _ in range(2)]:
        future.result(timeout=120)
    os.kill(next(iter(pool._processes)), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not pool._broken and time.monotonic() < deadline:  # the pool's manager thread sees the death, while idle
        time.sleep(0.05)
    assert pool._broken
    return pool


@pytest.mark.parametrize("path", ["shard batch", "map"])
def test_after_a_worker_died_the_retry_runs_in_a_fresh_pool_of_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """A worker that dies breaks its pool, lent or not, whether it was busy or idle: the call that meets the broken pool
    fails with BrokenProcessPool (Prefect retries the stage on it), and the retry's shard jobs and maps go to a fresh
    pool of worker processes, not to the broken one, nor one after another in the flow's process."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from tasks.runner.stage_runner import _run_one_shard, lend_pool, map_shards, plan_stage, run_shard_jobs, shutdown_worker_pools

    upstream = make_input_stage(tmp_path / "01_ingest")
    plan = plan_stage(DROP, DropOddConfig(), upstream, tmp_path / "02_drop", workers=2)
    calls: list[object] = []
    submit = ProcessPoolExecutor.submit

    def counted_submit(self, fn, *args, **kwargs):
        calls.append((self, fn))
        return submit(self, fn, *args, **kwargs)

    run = {"shard batch": lambda: [r.shard for r in run_shard_jobs(plan.jobs, 2)],
           "map": lambda: sorted(map_shards(_double, [(1,), (2,), (3,)], 2, "double", [1, 1, 1]))}[path]
    expected = {"shard batch": [job[4] for job in plan.jobs], "map": [2, 4, 6]}[path]
    broken = lent_pool_with_a_dead_worker()
    try:
        with lend_pool(2, broken):
            with pytest.raises(BrokenProcessPool):
                run()
            monkeypatch.setattr(ProcessPoolExecutor, "submit", counted_submit)
            assert run() == expected
        fresh = {pool for pool, _ in calls}
        assert len(fresh) == 1 and broken not in fresh and len(calls) == len(expected)
        assert {fn for _, fn in calls} == {_run_one_shard if path == "shard batch" else _double}
    finally:
        broken.shutdown(cancel_futures=True)
        shutdown_worker_pools()

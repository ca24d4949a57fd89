"""What a supervisor sees of a torchrun group (issue 24, part 7): per-rank logs, the first error, live metrics."""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from hymo_core.distributed.launch import MetricsFollower, RankLogs, check_batch_plan, torchrun_command
from hymo_core.train.config import SAMPLE_TRAIN


def feed(logs: RankLogs, lines: list[str]) -> None:
    for line in lines:
        logs(line)
    logs.close()


def test_rank_lines_go_to_their_logs_and_only_rank_0_is_shown(tmp_path):
    shown: list[str] = []
    logs = RankLogs(tmp_path / "logs", shown.append)
    feed(logs, ["[default0]:step 1/4 loss 3.2", "[default1]:a warning on rank 1", "I1201 torchrun starting workers",
                "[default0]:step 2/4 loss 3.1"])
    assert shown == ["step 1/4 loss 3.2", "step 2/4 loss 3.1"]
    assert (tmp_path / "logs" / "rank-0.log").read_text() == "step 1/4 loss 3.2\nstep 2/4 loss 3.1\n"
    assert (tmp_path / "logs" / "rank-1.log").read_text() == "a warning on rank 1\n"
    assert (tmp_path / "logs" / "torchrun.log").read_text() == "I1201 torchrun starting workers\n"


def test_the_first_error_line_of_any_rank_names_the_failure(tmp_path):
    logs = RankLogs(tmp_path, lambda line: None)
    feed(logs, ["[default0]:step 1/4", "[default2]:error: corpus.json: shard 3 sha256 differs",
                "[default0]:error: a later error on another rank", "E1201 failed (exitcode: 2) local_rank: 2 (pid: 7)"])
    failure = logs.failure(1)
    assert failure.rank == 2 and str(failure) == f"rank 2: corpus.json: shard 3 sha256 differs (full output: {tmp_path}/rank-2.log)"


def test_without_an_error_line_the_exception_then_the_exit_status_is_used(tmp_path):
    logs = RankLogs(tmp_path, lambda line: None)
    feed(logs, ["[default1]:[rank1]: Traceback (most recent call last):", '[default1]:[rank1]:   File "x.py", line 1',
                "[default1]:[rank1]: RuntimeError: gloo connection closed"])
    assert str(logs.failure(1)).startswith("rank 1: RuntimeError: gloo connection closed")
    killed = RankLogs(tmp_path / "killed", lambda line: None)  # rank 0's error is a consequence of rank 1's death
    feed(killed, ["[default0]:step 5/10", "[default0]:[rank0]: Traceback (most recent call last):",
                  "[default0]:[rank0]: RuntimeError: Connection closed by peer",
                  f"E1201 failed (exitcode: -{int(signal.SIGKILL)}) local_rank: 1 (pid: 9)"])
    assert str(killed.failure(1)).startswith("rank 1: exited with signal SIGKILL")


def test_metrics_follower_reports_each_complete_record_once(tmp_path):
    path, seen = tmp_path / "metrics.jsonl", []
    follow = MetricsFollower(path, seen.append)
    follow()  # no file yet
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": ')  # a record half written
    follow()
    assert seen == [{"step": 1}]
    with open(path, "a") as handle:
        handle.write('2}\n')
    follow()
    follow()
    assert seen == [{"step": 1}, {"step": 2}]
    path.write_text(json.dumps({"step": 1}) + "\n")  # a resumed run rewrites the file shorter
    follow()
    assert seen[-1] == {"step": 1} and len(seen) == 3


def test_batch_plan_is_checked_before_a_launch():
    check_batch_plan(SAMPLE_TRAIN, 1)
    windows = SAMPLE_TRAIN.batch_size * SAMPLE_TRAIN.gradient_accumulation_steps
    with pytest.raises(ValueError, match=f"{windows} windows does not split over {windows + 1} ranks"):
        check_batch_plan(SAMPLE_TRAIN, windows + 1)


def test_torchrun_command_tees_every_rank_and_passes_restarts(tmp_path):
    command = torchrun_command(2, ["--out", "o"], max_restarts=3, log_dir=tmp_path)
    assert "--max-restarts=3" in command and "--tee=3" in command and f"--log-dir={tmp_path}" in command
    assert command[-4:] == ["-m", "hymo_core.train", "--out", "o"]
    with pytest.raises(ValueError):
        torchrun_command(2, [], max_restarts=-1)

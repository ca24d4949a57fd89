"""The first result: the sample's pretrain is sized so the whole sample run stays short (timed by
bench/first_run.py, never here), and the README gives the quick look and where the expected time comes from."""
from __future__ import annotations

from pathlib import Path

from flows.config import load_config
from hymo_core.train.config import SAMPLE_TRAIN

REPO = Path(__file__).resolve().parents[2]
FIRST_RESULT_UPDATES = 40  # 100 s for 200 updates on a quiet 2-core machine (issue 46): a fifth of that leaves the data half room


def test_the_sample_pretrain_trains_a_fifth_of_the_recipe_with_its_own_schedule() -> None:
    train = load_config().pretrain.train
    assert train.max_steps <= FIRST_RESULT_UPDATES
    assert train.max_steps * train.tokens_per_update <= SAMPLE_TRAIN.tokens_per_update * SAMPLE_TRAIN.max_steps // 5
    assert train.warmup_steps < train.max_steps // 4  # the loss is falling for most of the run, not warming up
    assert train.eval_interval < train.max_steps  # a validation curve, not one point
    assert (train.batch_size, train.seq_len, train.peak_lr) == (SAMPLE_TRAIN.batch_size, SAMPLE_TRAIN.seq_len, SAMPLE_TRAIN.peak_lr)


def test_the_readme_gives_the_quick_look_and_the_bench_behind_the_time() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "hymo run --until shards" in readme and "bench/first_run.py" in readme
    assert (REPO / "bench" / "first_run.py").is_file()

"""TensorBoard event files beside metrics.jsonl: read back with TensorBoard's own EventAccumulator, they hold exactly
metrics.jsonl's scalars at its steps, also after a session was interrupted past its last checkpoint and resumed."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hymo_core.models.model import ModelConfig
from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.train.event_files import EVENT_FILE_PREFIX, scalars
from hymo_core.train.run import run_training
from tests.conftest import write_corpus

MODEL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
RECIPE = replace(SAMPLE_TRAIN, batch_size=4, seq_len=16, max_steps=4, warmup_steps=1, log_interval=1, eval_interval=2,
                 checkpoint_interval=2, eval_batches=2, peak_lr=1e-2)
QUIET = dict(cloze_path=None, progress=False, log=lambda *_: None)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Interrupted(Exception):
    pass


def read_events(directory) -> dict[str, list[tuple[int, float]]]:
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def expected_from_metrics(directory) -> dict[str, list[tuple[int, float]]]:
    expected: dict[str, list[tuple[int, float]]] = {}
    for line in (directory / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for tag, value in scalars(record):
            expected.setdefault(tag, []).append((record["step"], value))
    return expected


def assert_same(events, expected):
    assert sorted(events) == sorted(expected)
    for tag, points in expected.items():
        assert [step for step, _ in events[tag]] == [step for step, _ in points], tag
        assert [value for _, value in events[tag]] == pytest.approx([value for _, value in points], rel=1e-6), tag  # float32


def test_event_files_hold_the_metrics_scalars_and_a_resume_leaves_no_duplicate_or_backward_step(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "run"

    def stop_at_step_3(record):  # the session dies after logging update 3; its last checkpoint is step 2
        if record["kind"] == "train" and record["step"] == 3:
            raise Interrupted

    with pytest.raises(Interrupted):
        run_training(corpus, out, RECIPE, MODEL, resume=False, report=stop_at_step_3, **QUIET)
    assert [step for step, _ in read_events(out)["train/loss"]] == [1, 2, 3]
    summary = run_training(corpus, out, RECIPE, MODEL, resume=True, **QUIET)
    assert summary["resumed_from"].endswith("step-00000002.pt")

    events, expected = read_events(out), expected_from_metrics(out)
    assert_same(events, expected)
    assert [step for step, _ in events["train/loss"]] == [1, 2, 3, 4]  # step 3 once: the dead session's is purged
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert [v for _, v in events["train/loss_last_update"]] == pytest.approx([r["last_loss"] for r in train], rel=1e-6)
    assert [v for _, v in events["throughput/tokens_per_s"]] == pytest.approx([r["tokens_per_s"] for r in train], rel=1e-6)
    assert {"train/loss", "train/grad_norm_pre_clip", "eval/loss"} <= set(events)
    assert any(tag.startswith("train/lr/") for tag in events)
    # Per-source held-out loss: this corpus has no sources; tests/flows/test_watching_a_run.py reads those on a real run.


def test_a_fresh_run_replaces_a_previous_runs_event_files(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "run"
    run_training(corpus, out, replace(RECIPE, max_steps=2), MODEL, resume=False, **QUIET)
    for leftover in (out / "checkpoints").iterdir():  # a new run in the same directory
        leftover.unlink() if leftover.is_file() else None
    run_training(corpus, out, replace(RECIPE, max_steps=2, checkpoint_interval=1), MODEL, resume=False, **QUIET)
    assert len(list(out.glob(EVENT_FILE_PREFIX + "*"))) == 1
    assert_same(read_events(out), expected_from_metrics(out))


def test_only_metric_records_become_scalars():
    assert list(scalars({"kind": "alert", "step": 3, "value": 9.0})) == []
    assert dict(scalars({"kind": "eval", "step": 2, "val_loss": 3.5, "val_bpb": None,
                         "groups": {"source:web": {"loss": 3.25, "bpb": None, "tokens": 10}}})) == {"eval/loss": 3.5, "heldout/source:web": 3.25}
    train = dict(scalars({"kind": "train", "step": 1, "loss": 4.0, "last_loss": 3.9, "grad_norm_pre_clip": 1.5, "tokens_per_s": 100.0,
                          "mfu": None, "lr": {"adamw": 1e-3, "muon": 2e-2}}))
    assert train == {"train/loss": 4.0, "train/loss_last_update": 3.9, "train/grad_norm_pre_clip": 1.5,
                     "throughput/tokens_per_s": 100.0, "train/lr/adamw": 1e-3, "train/lr/muon": 2e-2}

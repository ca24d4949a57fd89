"""`hymo eval`'s default held-out set is the corpus's (issue 58): two checkpoints of one corpus are scored on the same
windows whatever each recipe's eval_batches, and paired output names each run by directory and step."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli import main
from tests.conftest import tiny_recipe



@pytest.fixture(scope="module")
def two_runs(tiny_run: Path, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("fixed-heldout")
    checkpoints = []
    for name, batches in (("small", 1), ("large", 3)):  # the same step, different eval_batches
        recipe = root / f"{name}.toml"
        recipe.write_text(tiny_recipe(2, eval_batches=batches))
        assert main(["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(root / name / "train")]) == 0
        checkpoints.append(root / name / "train" / "checkpoints" / "step-00000002.pt")
    return checkpoints


def test_two_checkpoints_with_different_eval_batches_get_the_same_windows(two_runs: list[Path], tiny_run: Path, capsys):
    results = []
    for checkpoint in two_runs:
        capsys.readouterr()
        assert main(["eval", str(checkpoint), "--corpus", str(tiny_run), "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    small, large = results
    assert small["windows"] == large["windows"] > 3 * 4  # more than either recipe's eval_batches x batch_size
    assert small["validation_tokens"] == large["validation_tokens"]
    assert {g: v["tokens"] for g, v in small["groups"].items()} == {g: v["tokens"] for g, v in large["groups"].items()}
    assert "the corpus's fixed set" in small["selection"]
    # an explicit --batches still chooses that many batches of the checkpoint's batch size
    assert main(["eval", str(two_runs[0]), "--corpus", str(tiny_run), "--json", "--batches", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["windows"] == 4


def test_paired_output_names_runs_by_directory_and_step(two_runs: list[Path], tiny_run: Path, capsys):
    capsys.readouterr()
    assert main(["eval", *map(str, two_runs), "--corpus", str(tiny_run)]) == 0
    text = capsys.readouterr().out
    assert "step-00000002.pt - step-00000002.pt" not in text
    assert "large/train@step 2 - small/train@step 2: held_out_loss" in text, text

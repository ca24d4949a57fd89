"""Stale stages (issue 45, part 3): after an upstream stage is republished with other outputs, every later
stage that read the old one is named, with the command that refreshes it, by `stale_stages`, by
`hymo manifest show --verify` (exit 1), by `hymo audit summary`, and `hymo train` refuses the corpus."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flows.cli import main
from manifests.staleness import StaleStageError, refuse_stale, stale_stages
from tasks.corpus.split import SplitConfig, run_split


@pytest.fixture
def republished(tiny_run: Path, tmp_path: Path) -> Path:
    """A copy of the tiny run whose split stage was recomputed with another validation fraction
    (as `hymo rerun RUN --stage split --until split` does after a config change)."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, symlinks=True)
    assert stale_stages(run) == []
    run_split(SplitConfig(validation_fraction=0.4), run / "03_dedup_fuzzy", run / "04_split", workers=1)
    return run


def test_every_stage_after_a_republished_one_is_stale_with_its_refresh_command(republished: Path) -> None:
    stale = stale_stages(republished)
    assert [s.directory for s in stale] == ["05_tokenizer", "06_mixture", "07_shards"]
    assert stale[0].because.startswith("04_split changed after it ran")
    assert {s.refresh_command for s in stale} == {f"hymo rerun {republished} --stage tokenizer"}
    with pytest.raises(StaleStageError, match=r"^training refused: 05_tokenizer is stale: 04_split changed .* `hymo rerun .* --stage tokenizer` \(and 2 later stages\)$"):
        refuse_stale(republished, "07_shards", "training")
    refuse_stale(republished, "04_split", "reading the split")  # nothing before the split is stale


def test_the_pretrain_stage_refuses_stale_shards_before_training(republished: Path) -> None:
    from tasks.pretrain import PretrainConfig, run_pretrain

    with pytest.raises(StaleStageError, match=r"^pretrain refused: 05_tokenizer is stale"):
        run_pretrain(PretrainConfig(), republished / "07_shards", republished / "08_pretrain")
    assert not (republished / "08_pretrain").exists()


def test_manifest_verify_audit_summary_and_train_say_so(republished: Path, tmp_path: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["manifest", "show", str(republished), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "STALE" in out and "07_shards is stale" in out and "--stage tokenizer" in out
    assert main(["audit", "summary", str(republished)]) == 0
    out = capsys.readouterr().out
    assert "! 05_tokenizer is stale" in out
    assert main(["train", "--corpus", str(republished), "--out", str(tmp_path / "train"), "--max-steps", "1"]) != 0
    captured = capsys.readouterr()
    assert "training refused: 05_tokenizer is stale" in captured.out + captured.err
    assert not (tmp_path / "train").exists()


def test_a_fresh_run_verifies(tiny_run: Path, capsys) -> None:
    assert main(["manifest", "show", str(tiny_run), "--verify"]) == 0
    assert "STALE" not in capsys.readouterr().out

"""Stale stages (issue 45, part 3): after an upstream stage is republished with other outputs, every later
stage that read the old one is named, with the command that refreshes it, by `stale_stages`, by
`hymo manifest show --verify` (exit 1), by `hymo audit summary`, and `hymo train` refuses the corpus."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

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
    # --until shards: the refresh recomputes the corpus and trains nothing (issue 56)
    assert {s.refresh_command for s in stale} == {f"hymo rerun {republished} --stage tokenizer --until shards"}
    with pytest.raises(StaleStageError, match=r"^training refused: 05_tokenizer is stale: 04_split changed .* `hymo rerun .* --stage tokenizer --until shards` \(and 2 later stages\)$"):
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


# --- issue 56: every entry point that reads a corpus refuses a stale one, through manifests.staleness.refuse_stale_corpus

REFUSED = "refused: 05_tokenizer is stale: 04_split changed"


def module_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HYMO_THREADS": "1"}


def test_python_m_hymo_core_train_refuses_a_stale_corpus(republished: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "hymo_core.train", "--corpus", str(republished / "07_shards"), "--out", str(tmp_path / "out"),
                           "--max-steps", "1"], cwd=tmp_path, env=module_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and f"error: training {REFUSED}" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_torchrun_of_the_training_module_refuses_a_stale_corpus_on_every_rank(republished: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "hymo_core.train",
                           "--corpus", str(republished), "--out", str(tmp_path / "out"), "--max-steps", "1"],
                          cwd=tmp_path, env=module_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and done.stderr.count(f"error: training {REFUSED}") == 2
    assert not (tmp_path / "out").exists()


def test_sweep_refuses_a_stale_corpus_before_the_first_proxy(republished: Path, tmp_path: Path, capsys) -> None:
    assert main(["sweep", "lr", "--corpus", str(republished), "--out", str(tmp_path / "sweep"), "--lrs", "0.001,0.01,0.1"]) != 0
    assert f"sweep {REFUSED}" in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()


def test_ablate_refuses_a_stale_base_run_before_a_server_starts(republished: Path, tmp_path: Path, capsys) -> None:
    from flows.ablate_spec import SAMPLE_SPEC

    assert main(["ablate", str(SAMPLE_SPEC), "--base-run", str(republished), "--out", str(tmp_path / "ablate")]) != 0
    assert f"ablation {REFUSED}" in capsys.readouterr().err
    assert not (tmp_path / "ablate").exists()


def test_cpt_refuses_a_stale_domain_or_general_corpus(republished: Path, tiny_run: Path, tmp_path: Path) -> None:
    from hymo_core.cpt.run import run_cpt

    for domain, general in ((republished, tiny_run), (tiny_run, republished / "07_shards" / "corpus.json")):
        with pytest.raises(StaleStageError, match=f"^continued pretraining {REFUSED}"):
            run_cpt(tmp_path / "no-checkpoint.pt", domain, general, tmp_path / "cpt")
    assert not (tmp_path / "cpt").exists()


def test_extend_refuses_a_stale_corpus(republished: Path, tmp_path: Path) -> None:
    from hymo_core.context.extend import run_extend

    with pytest.raises(StaleStageError, match=f"^context extension {REFUSED}"):
        run_extend(tmp_path / "no-checkpoint.pt", republished, tmp_path / "extend", 64)
    assert not (tmp_path / "extend").exists()

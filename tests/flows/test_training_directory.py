"""A `hymo train --out` directory is enough: its summary.json names the corpus, so `hymo trace` and `hymo export`
work on it without being told where the corpus is (issue 58, part 5), and an export is readable by others."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli import main
from tests.conftest import tiny_recipe

RECIPE = tiny_recipe()


@pytest.fixture(scope="module")
def trained(tiny_run: Path, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train-dir")
    (root / "recipe.toml").write_text(RECIPE)
    assert main(["train", "--corpus", str(tiny_run), "--config", str(root / "recipe.toml"), "--out", str(root / "out"), "--cloze", ""]) == 0
    return {"out": root / "out", "recipe": root / "recipe.toml"}


def test_summary_records_the_corpus(trained, tiny_run: Path):
    corpus = json.loads((trained["out"] / "summary.json").read_text())["corpus"]
    manifest = json.loads((tiny_run / "07_shards" / "corpus.json").read_text())
    assert corpus == {"path": str((tiny_run / "07_shards" / "corpus.json").resolve()), "digest": manifest["digest"],
                      "tokenizer_sha256": manifest["tokenizer"]["sha256"]}


def test_trace_a_training_directory(trained, tiny_run: Path, capsys):
    capsys.readouterr()
    assert main(["trace", str(trained["out"]), "--step", "2", "--json"]) == 0
    from_directory = json.loads(capsys.readouterr().out)
    assert main(["trace", str(tiny_run), "--step", "2", "--config", str(trained["recipe"]), "--json"]) == 0
    assert from_directory == json.loads(capsys.readouterr().out) and from_directory["documents"]
    assert main(["trace", str(trained["out"]), "--shard", "0", "--offset", "5", "--json"]) == 0  # a token, via the recorded corpus
    assert json.loads(capsys.readouterr().out)["doc_id"]


def test_trace_refuses_a_step_the_run_never_trained(trained, capsys):
    capsys.readouterr()
    assert main(["trace", str(trained["out"]), "--step", "5000"]) == 2
    error = capsys.readouterr().err
    assert "update 5000 is past the run's last update, 3" in error


def test_export_a_training_directory_checkpoint_without_corpus_readable_by_others(trained, tmp_path: Path):
    from hymo_core.interop.atomic_dir import current_umask

    hf = tmp_path / "hf"
    assert main(["export", str(trained["out"] / "checkpoints" / "step-00000003.pt"), "--hf", str(hf)]) == 0
    record = json.loads((hf / "hymo_export.json").read_text())
    assert record["corpus_digest"] == json.loads((trained["out"] / "summary.json").read_text())["corpus_digest"]
    umask = current_umask()
    assert umask & 0o044 == 0, f"this check needs a umask that lets others read (got {umask:03o})"
    assert hf.stat().st_mode & 0o777 == 0o777 & ~umask
    for path in hf.iterdir():
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, (path, oct(path.stat().st_mode))

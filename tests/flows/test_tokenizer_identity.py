"""A checkpoint scored, sampled or exported with another tokenizer of the same size is refused (issue 58, part 1).

The other tokenizer is the tiny run's own with two token ids swapped: same vocabulary size, another sha256,
and ids that mean other strings, as with a corpus built by another tokenizer run.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from flows.cli import main
from hymo_core.train.data import _canonical_digest
from tests.conftest import tiny_recipe

RECIPE = tiny_recipe(2)


def other_tokenizer_corpus(run: Path, target: Path) -> Path:
    """The run's shards directory with a tokenizer whose ids 300 and 301 are swapped (manifest re-digested)."""
    shutil.copytree(run / "07_shards", target)
    manifest = json.loads((target / "corpus.json").read_text())
    tokenizer_file = target / manifest["tokenizer"]["path"]
    tokenizer = json.loads(tokenizer_file.read_text())
    vocab = tokenizer["model"]["vocab"]
    by_id = {i: token for token, i in vocab.items()}
    vocab[by_id[300]], vocab[by_id[301]] = 301, 300
    tokenizer_file.write_text(json.dumps(tokenizer))
    import hashlib

    manifest["tokenizer"]["sha256"] = hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()
    manifest["digest"] = _canonical_digest(manifest)
    (target / "corpus.json").write_text(json.dumps(manifest))
    return target


@pytest.fixture(scope="module")
def trained(tiny_run: Path, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizer")
    (root / "recipe.toml").write_text(RECIPE)
    assert main(["train", "--corpus", str(tiny_run), "--config", str(root / "recipe.toml"), "--out", str(root / "out")]) == 0
    return {"checkpoint": root / "out" / "checkpoints" / "step-00000002.pt", "other": other_tokenizer_corpus(tiny_run, root / "other")}


def test_the_checkpoint_records_its_corpus_tokenizer(trained, tiny_run: Path):
    payload = torch.load(trained["checkpoint"], weights_only=True)
    corpus = json.loads((tiny_run / "07_shards" / "corpus.json").read_text())
    assert payload["tokenizer_sha256"] == corpus["tokenizer"]["sha256"]
    other = json.loads((trained["other"] / "corpus.json").read_text())
    assert other["tokenizer"]["vocab_size"] == corpus["tokenizer"]["vocab_size"] and other["tokenizer"]["sha256"] != corpus["tokenizer"]["sha256"]


@pytest.mark.parametrize("command", [["eval"], ["generate", "--prompt", "The river"], ["eval", "--suite", "mc", "--limit", "2"],
                                     ["export", "--hf", "HF"]])
def test_another_tokenizer_is_refused_in_one_line_naming_both_digests(trained, tiny_run: Path, tmp_path: Path, command, capsys):
    recorded = torch.load(trained["checkpoint"], weights_only=True)["tokenizer_sha256"]
    given = json.loads((trained["other"] / "corpus.json").read_text())["tokenizer"]["sha256"]
    argv = [command[0], str(trained["checkpoint"]), "--corpus", str(trained["other"]),
            *[str(tmp_path / "hf") if a == "HF" else a for a in command[1:]]]
    capsys.readouterr()
    assert main(argv) == 2  # refused inputs (hymo_core.exit_codes)
    captured = capsys.readouterr()
    error = captured.err.strip()
    assert "\n" not in error and "TokenizerMismatch" in error and recorded in error and given in error, error
    assert not (tmp_path / "hf").exists()


def test_a_checkpoint_from_before_the_field_is_used_with_a_warning(trained, tiny_run: Path, tmp_path: Path, capsys):
    payload = torch.load(trained["checkpoint"], weights_only=True)
    del payload["tokenizer_sha256"]
    old = tmp_path / "step-00000002.pt"
    torch.save(payload, old)
    capsys.readouterr()
    assert main(["eval", str(old), "--corpus", str(trained["other"]), "--json"]) == 0
    captured = capsys.readouterr()
    assert "written before checkpoints recorded their tokenizer's sha256" in captured.err
    assert json.loads(captured.out)["step"] == 2

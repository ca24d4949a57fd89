"""Artifacts are hashed once, by the task that writes them (issue 45, part 8): the shards stage's token
files and indexes and the mixture's plan parts and token stream are not read again on the flow host to build
the manifest, and the digests it records are the files' own (a full verify re-hashes them)."""
from __future__ import annotations

from pathlib import Path

import tasks.runner.stage_runner as stage_runner
from manifests.digest import sha256_file
from manifests.stage_manifest import read_manifest
from tasks.corpus.shards import ShardsConfig, run_shards


def test_the_host_hashes_no_token_file(tiny_run: Path, tmp_path: Path, monkeypatch) -> None:
    hashed: list[str] = []

    def counting(path, *args, **kwargs):
        hashed.append(Path(path).name)
        return sha256_file(path, *args, **kwargs)

    monkeypatch.setattr(stage_runner, "sha256_file", counting)  # what the stage writer (the flow host) reads to hash
    manifest = run_shards(ShardsConfig(tokens_per_shard=4096), tiny_run / "04_split", tiny_run / "05_tokenizer", tiny_run / "06_mixture",
                          tmp_path / "07_shards", workers=1)
    token_files = [f.path for f in manifest.files("artifact") if f.path.startswith("tokens/")]
    assert len(token_files) >= 10  # 5+ train shards and a validation shard, each a .bin and an index
    assert not [name for name in hashed if name.endswith((".bin", ".idx.parquet"))], hashed
    assert sorted(hashed) == ["corpus.json", "tokenizer.json", "validation_documents.parquet"]
    read_manifest(manifest.directory, verify=True, full=True)  # every recorded digest is the file's


def test_the_host_hashes_no_plan_part_of_the_mixture(tiny_run: Path, tmp_path: Path, monkeypatch) -> None:
    from tasks.corpus.mixture import MixtureConfig, run_mixture

    hashed: list[str] = []

    def counting(path, *args, **kwargs):
        hashed.append(Path(path).name)
        return sha256_file(path, *args, **kwargs)

    monkeypatch.setattr(stage_runner, "sha256_file", counting)
    weights = {"prose": 0.5, "mixed": 0.5}
    manifest = run_mixture(MixtureConfig(weights=weights, total_tokens=30_000, max_epochs=4.0), tiny_run / "04_split", tiny_run / "05_tokenizer",
                           tmp_path / "06_mixture", workers=1)
    assert [f.path for f in manifest.files("artifact") if f.path.startswith("plan/")]
    # train_tokens.bin is joined region by region by several tasks, and hashed whole by one more task
    assert sorted(hashed) == ["mixture.json"], hashed
    read_manifest(manifest.directory, verify=True, full=True)

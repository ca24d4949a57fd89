"""A corpus from one run's held-out split, tokenized with another run's tokenizer.

Continued pretraining needs its domain corpus in the base model's token ids
(seed 001, Lab 5: keep the tokenizer fixed; new ids would need new embedding
rows). A domain run built with `hymo run --config DOMAIN --until split` has its
own split but no usable tokenizer, so this runs the mixture and shards stages
on that split with the base run's tokenizer stage, into OUT/01_mixture and
OUT/02_shards: OUT is then a run directory `hymo cpt` reads. Both stages are
the pipeline's own, with their manifests, cache keys and atomic writes.
"""
from __future__ import annotations

from pathlib import Path

from manifests.run_dir import completed_stages
from manifests.stage_manifest import StageManifest
from tasks.corpus.mixture import MixtureConfig, run_mixture
from tasks.corpus.shards import ShardsConfig, run_shards


def published_stage(run: Path, stage: str) -> Path:
    found = [stage_dir.path for stage_dir, _ in completed_stages(Path(run)) if stage_dir.stage == stage]
    if len(found) != 1:
        raise FileNotFoundError(f"{run}: expected one completed {stage} stage, found {len(found)}")
    return found[0]


def retokenize(split_run: str | Path, tokenizer_run: str | Path, out: str | Path, mixture: MixtureConfig = MixtureConfig(),
               shards: ShardsConfig = ShardsConfig()) -> StageManifest:
    """OUT/01_mixture and OUT/02_shards from `split_run`'s split and `tokenizer_run`'s tokenizer."""
    split_dir, tokenizer_dir, out = published_stage(Path(split_run), "split"), published_stage(Path(tokenizer_run), "tokenizer"), Path(out)
    run_mixture(mixture, split_dir, tokenizer_dir, out / "01_mixture")
    return run_shards(shards, split_dir, tokenizer_dir, out / "01_mixture", out / "02_shards")

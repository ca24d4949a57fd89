"""Pretrain stage: the last task of the pipeline, training the sample model on the shards stage's corpus.

An artifact stage (tasks.stage_runner.run_artifact_stage): cache key over
this config and the shards manifest's digest, published atomically with
summary.json, metrics.jsonl, loss.png and the final (and best) checkpoint.

Resume: the stage's hidden work directory is wiped on every new attempt, so
training writes into a persistent directory beside the stage,
`RUN/.pretrain_ckpt/<cache key>/`. A killed attempt re-run with the same key
continues from its newest checkpoint instead of starting over; a changed
config or corpus gets a new key and starts fresh. The persistent directory
is removed once the stage has published.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hymo_core.configs import CHECKPOINT_DIR, EXPERT_LOAD_PICTURE, LOSS_PICTURE, METRICS_FILE, SAMPLE_MODEL, SAMPLE_TRAIN, SUMMARY_FILE, ModelConfig, TrainConfig
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.stage_runner import run_artifact_stage, stage_cache_key

STAGE = "pretrain"
VERSION = "1"
CHECKPOINT_ROOT = ".pretrain_ckpt"



@dataclass(frozen=True)
class PretrainConfig:
    """Seed 002's TrainConfig and the model shape (default: the sample recipe, hymo_core.train.SAMPLE_*);
    the vocabulary size always comes from the corpus. `train.max_steps` is the knob for a shorter run.
    A `[pretrain.model]` table is a whole ModelConfig: keys it omits take ModelConfig's (Lab 2) defaults."""

    train: TrainConfig = field(default_factory=lambda: SAMPLE_TRAIN)
    model: ModelConfig = field(default_factory=lambda: SAMPLE_MODEL)
    cloze: str = ""  # a cloze JSONL scored into summary.json; "" = the bundled sample set


def _cloze_path(config: PretrainConfig) -> str | Path:
    from hymo_core.evaluation import SAMPLE_CLOZE

    return config.cloze or SAMPLE_CLOZE


def checkpoint_home(out_dir: Path, shards_dir: Path, config: PretrainConfig) -> Path:
    key = stage_cache_key(STAGE, VERSION, asdict(config), [read_manifest(shards_dir).digest])
    return Path(out_dir).parent / CHECKPOINT_ROOT / key[:16]


def build_pretrain(config: PretrainConfig, shards_dir: Path, work_dir: Path, home: Path) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    from hymo_core.train import run_training  # torch: imported when training runs, not with the pipeline

    summary = run_training(shards_dir, home, config.train, config.model, resume=True, cloze_path=_cloze_path(config))
    pictures = [name for name in (LOSS_PICTURE, EXPERT_LOAD_PICTURE) if (home / name).is_file()]
    for name in (METRICS_FILE, *pictures):
        shutil.copy2(home / name, work_dir / name)
    (work_dir / CHECKPOINT_DIR).mkdir()
    published = {Path(summary["checkpoint"]).name}
    if summary.get("best_checkpoint"):
        published.add(summary["best_checkpoint"])
    for name in sorted(published):
        shutil.copy2(home / CHECKPOINT_DIR / name, work_dir / CHECKPOINT_DIR / name)
    # Paths relative to the published stage: the persistent directory goes away after publishing.
    summary["checkpoint"] = f"{CHECKPOINT_DIR}/{Path(summary['checkpoint']).name}"
    if summary.get("best_checkpoint"):
        summary["best_checkpoint"] = f"{CHECKPOINT_DIR}/{summary['best_checkpoint']}"
    (work_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    metric_rows = sum(1 for _ in open(work_dir / METRICS_FILE, encoding="utf-8"))
    artifacts = [(SUMMARY_FILE, None), (METRICS_FILE, metric_rows)] + [(name, None) for name in pictures]
    artifacts += [(f"{CHECKPOINT_DIR}/{name}", None) for name in sorted(published)]
    extra = {k: summary.get(k) for k in ("final_step", "final_train_loss", "final_val_loss", "weights_sha256", "tokens_seen",
                                         "skipped_updates", "parameters", "resumed_from")}
    extra["checkpoint"] = summary["checkpoint"]
    if "cloze" in summary:
        extra["cloze_accuracy"] = summary["cloze"]["accuracy"]
    return artifacts, extra


def run_pretrain(config: PretrainConfig, shards_dir: Path, out_dir: Path) -> StageManifest:
    """Train on `shards_dir`'s corpus and publish `out_dir`; a no-op when already published under this key."""
    shards_dir, out_dir = Path(shards_dir), Path(out_dir)
    home = checkpoint_home(out_dir, shards_dir, config)
    manifest = run_artifact_stage(STAGE, VERSION, asdict(config), [shards_dir], out_dir,
                                  lambda work_dir: build_pretrain(config, shards_dir, work_dir, home))
    shutil.rmtree(home, ignore_errors=True)
    if home.parent.is_dir() and not any(home.parent.iterdir()):
        home.parent.rmdir()
    return manifest

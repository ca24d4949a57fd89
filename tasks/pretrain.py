"""Pretrain stage: the last task of the pipeline, training the sample model on the shards stage's corpus.

An artifact stage (tasks.runner.stage_runner.run_artifact_stage): cache key over
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
from typing import Any, Callable

from hymo_core.models.configs import SAMPLE_MODEL, ModelConfig
from hymo_core.train.config import CHECKPOINT_DIR, EXPERT_LOAD_PICTURE, LOSS_PICTURE, METRICS_FILE, SAMPLE_TRAIN, SUMMARY_FILE, TrainConfig
from manifests.stage_manifest import StageManifest, read_manifest
from manifests.staleness import refuse_stale_corpus
from tasks.runner.stage_runner import run_artifact_stage, stage_cache_key

STAGE = "pretrain"
VERSION = "1"
CHECKPOINT_ROOT = ".pretrain_ckpt"



@dataclass(frozen=True)
class PretrainConfig:
    """Seed 002's TrainConfig and the model shape (default: the sample recipe, hymo_core.train.run.SAMPLE_*);
    the vocabulary size always comes from the corpus. `train.max_steps` is the knob for a shorter run.
    A `[pretrain.model]` table is a whole ModelConfig: keys it omits take ModelConfig's (Lab 2) defaults."""

    train: TrainConfig = field(default_factory=lambda: SAMPLE_TRAIN)
    model: ModelConfig = field(default_factory=lambda: SAMPLE_MODEL)
    cloze: str = ""  # a cloze JSONL scored into summary.json; "" = the bundled sample set
    nproc: int = 1  # ranks on this machine; > 1 runs the trainer under torchrun (FSDP2, DCP checkpoints)

    def __post_init__(self) -> None:
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or self.nproc < 1:
            raise ValueError(f"[pretrain] nproc must be a positive integer, got {self.nproc!r}")


def _cloze_path(config: PretrainConfig) -> str | Path:
    from hymo_core.eval.evaluation import SAMPLE_CLOZE

    return config.cloze or SAMPLE_CLOZE


def checkpoint_home(out_dir: Path, shards_dir: Path, config: PretrainConfig) -> Path:
    key = stage_cache_key(STAGE, VERSION, asdict(config), [read_manifest(shards_dir).digest])
    return Path(out_dir).parent / CHECKPOINT_ROOT / key[:16]


def train_in_process_group(config: PretrainConfig, shards_dir: Path, home: Path, log: Callable[[str], None] = print,
                           report: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """`nproc` ranks under torchrun; rank 0's lines go to `log` (the Prefect run log: the flow logs prints), and
    each metrics record rank 0 writes to `report` as it appears (the live training artifact)."""
    from hymo_core.distributed.launch import check_batch_plan, launch_training, train_arguments

    check_batch_plan(config.train, config.nproc)
    home.mkdir(parents=True, exist_ok=True)
    recipe = home / "recipe.toml"
    recipe.write_text(recipe_toml(config.train, config.model), encoding="utf-8")
    args = train_arguments(shards_dir, home, recipe, resume=True)
    if config.cloze:
        args += ["--cloze", str(config.cloze)]
    launch_training(config.nproc, args, on_line=log, report=report)
    return json.loads((home / SUMMARY_FILE).read_text(encoding="utf-8"))


def recipe_toml(train: TrainConfig, model: ModelConfig) -> str:
    """[train] and [model] tables as `python -m hymo_core.train --config` reads them (JSON scalars are TOML scalars)."""
    lines = []
    train_values = train.to_dict()
    alerts = train_values.pop("alerts")  # None (the defaults) has no TOML form; tables become [[alerts]]
    for table, values in (("train", train_values), ("model", asdict(model))):
        lines.append(f"[{table}]")
        lines += [f"{key} = {json.dumps(list(value) if isinstance(value, tuple) else value)}" for key, value in values.items()]
        lines.append("")
    for alert in alerts if alerts is not None else []:
        lines += ["[[alerts]]"] + [f"{key} = {json.dumps(value)}" for key, value in alert.items()] + [""]
    if alerts == []:
        lines += ["[[alerts]]", 'metric = "none"', ""]  # no alerts at all
    return "\n".join(lines)


def _publish_checkpoint(source: Path, target: Path) -> list[str]:
    """Copy one checkpoint (a file, or a DCP directory) and return its files relative to the target's parent."""
    if source.is_dir():
        shutil.copytree(source, target)
        return [f"{CHECKPOINT_DIR}/{target.name}/{p.relative_to(target)}" for p in sorted(target.rglob("*")) if p.is_file()]
    shutil.copy2(source, target)
    return [f"{CHECKPOINT_DIR}/{target.name}"]


def build_pretrain(config: PretrainConfig, shards_dir: Path, work_dir: Path, home: Path,
                   report: Callable[[dict[str, Any]], None] | None = None) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    """`report`: every metrics record while it trains (one process or, read from metrics.jsonl, torchrun's rank 0)."""
    if config.nproc > 1:
        summary = train_in_process_group(config, shards_dir, home, report=report)
    else:
        from hymo_core.train.run import run_training  # torch: imported when training runs, not with the pipeline

        summary = run_training(shards_dir, home, config.train, config.model, resume=True, cloze_path=_cloze_path(config), report=report)
    pictures = [name for name in (LOSS_PICTURE, EXPERT_LOAD_PICTURE) if (home / name).is_file()]
    for name in (METRICS_FILE, *pictures):
        shutil.copy2(home / name, work_dir / name)
    (work_dir / CHECKPOINT_DIR).mkdir()
    published = {Path(summary["checkpoint"]).name}
    if summary.get("best_checkpoint"):
        published.add(summary["best_checkpoint"])
    checkpoint_files = []
    for name in sorted(published):
        checkpoint_files += _publish_checkpoint(home / CHECKPOINT_DIR / name, work_dir / CHECKPOINT_DIR / name)
    # Paths relative to the published stage: the persistent directory goes away after publishing.
    summary["checkpoint"] = f"{CHECKPOINT_DIR}/{Path(summary['checkpoint']).name}"
    if summary.get("best_checkpoint"):
        summary["best_checkpoint"] = f"{CHECKPOINT_DIR}/{summary['best_checkpoint']}"
    (work_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    metric_rows = sum(1 for _ in open(work_dir / METRICS_FILE, encoding="utf-8"))
    artifacts = [(SUMMARY_FILE, None), (METRICS_FILE, metric_rows)] + [(name, None) for name in pictures]
    artifacts += [(relpath, None) for relpath in checkpoint_files]
    extra = {k: summary.get(k) for k in ("final_step", "final_train_loss", "final_val_loss", "weights_sha256", "tokens_seen",
                                         "skipped_updates", "parameters", "resumed_from")}
    extra["checkpoint"] = summary["checkpoint"]
    if "cloze" in summary:
        extra["cloze_accuracy"] = summary["cloze"]["accuracy"]
    return artifacts, extra


def run_pretrain(config: PretrainConfig, shards_dir: Path, out_dir: Path,
                 report: Callable[[dict[str, Any]], None] | None = None) -> StageManifest:
    """Train on `shards_dir`'s corpus and publish `out_dir`; a no-op when already published under this key.
    `report` receives every metrics record while training (hymo_core.train.run.run_training)."""
    shards_dir, out_dir = Path(shards_dir), Path(out_dir)
    refuse_stale_corpus(shards_dir, "pretrain")  # shards cut from a corpus an upstream rerun has changed since
    home = checkpoint_home(out_dir, shards_dir, config)
    manifest = run_artifact_stage(STAGE, VERSION, asdict(config), [shards_dir], out_dir,
                                  lambda work_dir: build_pretrain(config, shards_dir, work_dir, home, report))
    shutil.rmtree(home, ignore_errors=True)
    if home.parent.is_dir() and not any(home.parent.iterdir()):
        home.parent.rmdir()
    return manifest

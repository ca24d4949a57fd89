"""Model-based quality: score every document with the fastText quality classifier, then threshold or sample.

Seed 001, "基于模型的质量过滤器" (and "按成本排序": the expensive model runs after
the cheap heuristics). Each scored document gets `meta.quality_score` = P(hq)
(DCLM's enricher). `mode = "threshold"` removes scores below `threshold`
(rule `quality_model_low_score`); `mode = "sample"` keeps a document with
probability f(score), a linear ramp from `sample_floor` to `sample_ceiling`,
against a uniform draw from a seeded hash of its id, so a re-run keeps the same
documents (rule `quality_model_sampled_out`, value = score, threshold = the
keep probability). The classifier encodes its training data's taste (seed 001:
it narrows coverage), so it runs only on the sources and languages listed.
The model file's sha256 is part of the stage's cache key.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from manifests.schema import DOC_SCHEMA, dumps_json
from manifests.sources import PACKAGE_DIR
from manifests.stage_manifest import StageManifest
from tasks.filters.fasttext_model import ModelFileMissing, load_fasttext, model_sha256
from tasks.filters.quality_classifier import positive_scores
from tasks.runner.stage_runner import ShardOutcome, StageDef, run_stage

STAGE = "quality_model"
VERSION = "1"
SAMPLE_MODEL = PACKAGE_DIR / "models" / "quality-sample" / "model.bin"
MODES = ("threshold", "sample")
SCORE_KEY = "quality_score"


@dataclass(frozen=True)
class QualityModelConfig:
    enabled: bool = False  # the stage is in the pipeline only when true (the sample config turns it on)
    model_path: str = ""  # empty: the sample's classifier in manifests/models/quality-sample/
    mode: str = "threshold"  # threshold | sample
    threshold: float = 0.5  # mode threshold: remove when P(hq) < threshold
    sample_floor: float = 0.0  # mode sample: keep probability 0 at or below this score ...
    sample_ceiling: float = 1.0  # ... rising linearly to 1 at this score
    seed: int = 0  # mode sample: the per-document draw is a hash of (seed, id)
    sources: tuple[str, ...] = ("*",)  # sources scored; others pass unscored
    langs: tuple[str, ...] = ("en",)  # languages scored (the sample model is English); ("*",) = any
    batch_docs: int = 256  # documents per fastText call


def model_file(config: QualityModelConfig) -> Path:
    path = Path(config.model_path) if config.model_path else SAMPLE_MODEL
    if not path.is_file():
        raise ModelFileMissing(f"{path}: quality classifier not found (quality_model.model_path; train one with `hymo classifier train`)")
    return path


def model_digest(config: QualityModelConfig) -> list[tuple[str, str]]:
    """The model file's sha256, part of the cache key: a retrained model recomputes the stage."""
    path = model_file(config)
    return [(f"quality_model:{path.name}", model_sha256(str(path)))]


def check_config(config: QualityModelConfig) -> None:
    if config.mode not in MODES:
        raise ValueError(f"quality_model.mode must be one of {MODES}, got {config.mode!r}")
    if config.mode == "sample" and not config.sample_floor < config.sample_ceiling:
        raise ValueError(f"quality_model: sample_floor {config.sample_floor} must be below sample_ceiling {config.sample_ceiling}")


def keep_probability(scores: np.ndarray, config: QualityModelConfig) -> np.ndarray:
    """f(score): 0 up to the floor, 1 from the ceiling, linear in between."""
    return np.clip((scores - config.sample_floor) / (config.sample_ceiling - config.sample_floor), 0.0, 1.0)


def uniform_draws(ids: list[str], seed: int) -> np.ndarray:
    """One number in [0, 1) per document from a hash of (seed, id): the same documents on every re-run and machine."""
    return np.array([xxhash.xxh64_intdigest(doc_id.encode("utf-8", "surrogatepass"), seed=seed) for doc_id in ids], dtype=np.float64) / 2.0**64


def wanted(values: list[str | None], allowed: tuple[str, ...]) -> np.ndarray:
    if "*" in allowed:
        return np.ones(len(values), dtype=bool)
    return np.array([value in allowed for value in values], dtype=bool)


def quality_model_shard(docs: pa.Table, config: QualityModelConfig, context: Any = None) -> ShardOutcome:
    check_config(config)
    ids = docs.column("id").to_pylist()
    scored = wanted(docs.column("source").to_pylist(), config.sources) & wanted(docs.column("lang").to_pylist(), config.langs)
    positions = np.flatnonzero(scored)
    texts = docs.column("text").to_pylist()
    model = load_fasttext(str(model_file(config))) if len(positions) else None
    scores = np.zeros(len(ids))
    for start in range(0, len(positions), config.batch_docs):
        chunk = positions[start: start + config.batch_docs]
        scores[chunk] = positive_scores(model, [texts[i] for i in chunk])
    if config.mode == "threshold":
        limits = np.full(len(ids), config.threshold)
        draws = None
        keep = ~scored | (scores >= config.threshold)
    else:
        limits = keep_probability(scores, config)
        draws = uniform_draws(ids, config.seed)
        keep = ~scored | (draws < limits)
    metas = docs.column("meta").to_pylist()
    audit: list[dict[str, Any]] = []
    for i in positions:
        meta = json.loads(metas[i])
        meta[SCORE_KEY] = round(float(scores[i]), 6)
        metas[i] = dumps_json(meta)
        if not keep[i]:
            detail = {"mode": config.mode, "source": docs.column("source")[i].as_py(), "lang": docs.column("lang")[i].as_py()}
            if draws is None:
                rule = "quality_model_low_score"
            else:
                rule = "quality_model_sampled_out"
                detail.update(keep_probability=round(float(limits[i]), 6), draw=round(float(draws[i]), 6))
            audit.append({"id": ids[i], "action": "removed", "rule": rule, "value": float(scores[i]), "threshold": float(limits[i]), "detail": detail})
    labelled = docs.set_column(DOC_SCHEMA.get_field_index("meta"), "meta", pa.array(metas, pa.string()))
    return ShardOutcome(labelled.filter(pa.array(keep, pa.bool_())), audit)


QUALITY_MODEL = StageDef(STAGE, VERSION, quality_model_shard, external_inputs=model_digest)


def run_quality_model(config: QualityModelConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    check_config(config)
    return run_stage(QUALITY_MODEL, config, input_dir, out_dir, workers)

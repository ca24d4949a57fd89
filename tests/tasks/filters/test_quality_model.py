"""The fastText quality classifier: training writes a reproducible model card; the stage scores, thresholds or samples."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from manifests.schema import docs_table
from manifests.sources import load_source
from tasks.filters.quality_classifier import ClassifierTrainConfig, roc_auc, train_classifier
from tasks.filters.quality_model import SAMPLE_MODEL, QualityModelConfig, keep_probability, run_quality_model, uniform_draws
from tasks.runner.stage_runner import StageWriter, read_stage_audit, read_stage_docs

import numpy as np

WIKI = [json.loads(line)["text"] for line in (Path(load_source("prose-enwiki").root).read_text(encoding="utf-8").splitlines()[:3])]
JUNK = ["Home | Login | Sign up | Cart (0) | Wishlist | Buy now | Free shipping | Click here | Subscribe | Contact us\n" * 8,
        "cheap pills cheap pills buy cheap pills online best price best price order now order now " * 6]


def publish_upstream(out: Path, rows: list[dict]) -> Path:
    writer = StageWriter("quality", "1", {}, "key", [], out)
    writer.write_shard(0, docs_table(rows[: len(rows) // 2]), [])
    writer.write_shard(1, docs_table(rows[len(rows) // 2:]), [])
    writer.publish()
    return out


def doc(doc_id: str, text: str, source: str = "web", lang: str = "en") -> dict:
    return {"id": doc_id, "text": text, "source": source, "url": "", "lang": lang, "lang_score": 0.9, "meta": {"profile": "prose"}}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> Path:
    rows = [doc(f"wiki-{i}", t) for i, t in enumerate(WIKI)] + [doc(f"junk-{i}", t) for i, t in enumerate(JUNK)]
    rows += [doc("docs-page", JUNK[0], source="docs"), doc("german", JUNK[1], lang="de")]
    return publish_upstream(tmp_path_factory.mktemp("qm") / "04_quality", rows)


def test_threshold_mode_scores_every_wanted_document_and_audits_removals(upstream, tmp_path):
    config = QualityModelConfig(enabled=True, sources=("web",))
    manifest = run_quality_model(config, upstream, tmp_path / "05_quality_model", workers=1)
    kept = {d["id"]: json.loads(d["meta"]) for d in read_stage_docs(tmp_path / "05_quality_model").to_pylist()}
    audit = {r["id"]: r for r in read_stage_audit(tmp_path / "05_quality_model").to_pylist()}
    assert set(audit) == {"junk-0", "junk-1"} and manifest.counts["removed"] == {"quality_model_low_score": 2}
    assert all(r["value"] < r["threshold"] == 0.5 and json.loads(r["detail"])["mode"] == "threshold" for r in audit.values())
    assert all(kept[f"wiki-{i}"]["quality_score"] >= 0.5 for i in range(3))
    assert "quality_score" not in kept["docs-page"] and "quality_score" not in kept["german"]  # other source / language: not scored
    assert any(i.get("file", "").startswith("quality_model:") for i in manifest.inputs)  # the model's sha256 is a cache-key input


def test_sample_mode_is_seeded_per_document_and_records_the_probability(upstream, tmp_path):
    config = QualityModelConfig(enabled=True, mode="sample", sample_floor=0.2, sample_ceiling=0.9, sources=("*",), langs=("*",))
    first = run_quality_model(config, upstream, tmp_path / "a", workers=1)
    again = run_quality_model(config, upstream, tmp_path / "b", workers=1)
    assert [o.sha256 for o in first.outputs] == [o.sha256 for o in again.outputs]
    for row in read_stage_audit(tmp_path / "a").to_pylist():
        detail = json.loads(row["detail"])
        assert row["rule"] == "quality_model_sampled_out" and detail["draw"] >= detail["keep_probability"] == pytest.approx(row["threshold"], abs=1e-6)
    assert keep_probability(np.array([0.1, 0.2, 0.55, 0.9, 1.0]), config).tolist() == pytest.approx([0.0, 0.0, 0.5, 1.0, 1.0])
    draws = uniform_draws([f"d{i}" for i in range(2000)], seed=0)
    assert 0.45 < draws.mean() < 0.55 and not np.array_equal(draws, uniform_draws([f"d{i}" for i in range(2000)], seed=1))


def test_a_retrained_model_recomputes_the_stage(upstream, tmp_path, trained):
    model = tmp_path / "model.bin"
    shutil.copy(SAMPLE_MODEL, model)
    config = QualityModelConfig(enabled=True, model_path=str(model))
    first = run_quality_model(config, upstream, tmp_path / "05", workers=1)
    assert run_quality_model(config, upstream, tmp_path / "05", workers=1).cache_key == first.cache_key
    shutil.copy(trained / "model.bin", model)
    assert run_quality_model(config, upstream, tmp_path / "05", workers=1).cache_key != first.cache_key


def test_bad_mode_and_missing_model_are_clear_errors(upstream, tmp_path):
    with pytest.raises(ValueError, match="mode must be one of"):
        run_quality_model(QualityModelConfig(enabled=True, mode="top"), upstream, tmp_path / "x", workers=1)
    with pytest.raises(RuntimeError, match="quality classifier not found"):
        run_quality_model(QualityModelConfig(enabled=True, model_path=str(tmp_path / "none.bin")), upstream, tmp_path / "x", workers=1)


POSITIVES, NEGATIVES = ["prose-enwiki"], ["generated?label=navigation,spam"]
TINY = ClassifierTrainConfig(dim=16, bucket=5000, epoch=10, chunk_words=64)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A small classifier on two bundled JSONL sources: Wikipedia sections vs the generated navigation and spam pages."""
    root = tmp_path_factory.mktemp("train")
    train_classifier(POSITIVES, NEGATIVES, root / "model", TINY, root / "work", command="test")
    return root / "model"


def test_training_writes_model_card_and_is_reproducible(trained, tmp_path):
    card = json.loads((trained / "model.json").read_text())
    assert card["sha256"] and card["fasttext_params"]["wordNgrams"] == 2 and card["train_config"]["chunk_words"] == 64
    assert [s["docs"] for s in card["training_data"]["positives"]] == [288] and [s["docs"] for s in card["training_data"]["negatives"]] == [80]
    assert len(card["training_data"]["negatives"][0]["digest"]) == 64 and card["training_data"]["negatives"][0]["spec"] == NEGATIVES[0]
    held = card["heldout"]
    assert held["docs"] == card["training_data"]["heldout_docs"] > 0 and held["auc"] > 0.9 and held["recall"] > 0.8
    again = train_classifier(POSITIVES, NEGATIVES, tmp_path / "again", TINY, trained.parent / "work")
    assert again["sha256"] == card["sha256"]


def test_defaults_are_dclm_shaped_and_auc_counts_ties_half():
    defaults = ClassifierTrainConfig()
    assert (defaults.word_ngrams, defaults.dim, defaults.lr, defaults.epoch, defaults.loss) == (2, 256, 0.1, 5, "softmax")
    assert roc_auc(np.array([0.9, 0.5, 0.5, 0.1]), np.array([True, True, False, False])) == pytest.approx(0.875)


def test_the_bundled_sample_model_card_matches_its_file():
    from manifests.digest import sha256_file

    card = json.loads((SAMPLE_MODEL.parent / "model.json").read_text())
    assert card["sha256"] == sha256_file(SAMPLE_MODEL) and card["command"].startswith("hymo classifier train")


def test_the_train_command_line_maps_onto_the_config():
    from flows.cli import build_parser
    from flows.cli.classifier import SAMPLE_COMMAND, train_config_from_args

    args = build_parser().parse_args(["classifier", "train", "--positives", "a", "--negatives", "b?label=x,y", "--negatives", "c", "--out", "o",
                                      "--dim", "32", "--chunk-words", "64", "--quantize", "--lr", "0.2"])
    config = train_config_from_args(args)
    assert (config.dim, config.chunk_words, config.quantize, config.lr, config.word_ngrams) == (32, 64, True, 0.2, 2)
    assert args.negatives == ["b?label=x,y", "c"]
    card = json.loads((SAMPLE_MODEL.parent / "model.json").read_text())
    assert card["command"] == SAMPLE_COMMAND  # the documented command is the one that made the bundled model

"""Language identification: fastText lid.176 on the whole document, keep wanted languages above a score.

Seed 001, "语种识别": a linear classifier over character n-grams scores each
language; keep documents whose top language is wanted and whose score exceeds
0.65 (the FineWeb English pipeline's value). The model is the compressed
lid.176.ftz shipped in manifests/models/ with its licence; nothing is
downloaded at run time. Every document gets `lang` and `lang_score`; removals
are langid_empty_text, langid_low_score or langid_unwanted_lang.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from manifests.sources import PACKAGE_DIR
from manifests.stage_manifest import StageManifest
from tasks.filters.fasttext_model import LABEL_PREFIX, ModelFileMissing, load_fasttext, model_sha256, one_line, one_lines
from tasks.runner.rule_stats import doc_rank, stats_rows
from tasks.runner.stage_runner import ShardOutcome, StageDef, run_stage

STAGE = "langid"
VERSION = "2"  # 2: stats/ holds langid_low_score's score on a sample of the documents it measured
BUNDLED_MODEL = PACKAGE_DIR / "models" / "lid.176.ftz"


@dataclass(frozen=True)
class LangIdConfig:
    langs: tuple[str, ...] = ("en", "zh")  # wanted languages (lid.176 codes); ("*",) keeps any language
    min_score: float = 0.65  # keep when the top score is strictly above this (FineWeb, seed 001)
    top_k: int = 3  # runner-up languages recorded in the audit detail
    model_path: str = ""  # empty: manifests/models/lid.176.ftz
    # source -> its spec's `langs`, kept from that source besides `langs` (a source with langs = ["de"] keeps German);
    # filled from the run's source specs by the pipeline (flows/stages.py)
    source_langs: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def wanted(self, source: str) -> tuple[str, ...]:
        """The languages kept from `source`: the stage's and its spec's."""
        return self.langs + tuple(lang for lang in self.source_langs.get(source, ()) if lang not in self.langs)


class LangIdModelMissing(ModelFileMissing):
    """The language-ID model file is missing (the bundled one, or langid.model_path)."""


def bundled_model_path() -> Path:
    if not BUNDLED_MODEL.is_file():
        raise LangIdModelMissing(f"{BUNDLED_MODEL}: bundled lid.176.ftz missing from the install; reinstall hymo or set langid.model_path")
    return BUNDLED_MODEL


def load_model(model_path: str = "") -> Any:
    """lid.176 (or `model_path`), loaded once per process."""
    path = Path(model_path) if model_path else bundled_model_path()
    if not path.is_file():
        raise LangIdModelMissing(f"{path}: language-ID model file not found (langid.model_path)")
    return load_fasttext(str(path))


def predict_languages(text: str, model: Any, k: int) -> list[tuple[str, float]]:
    """Top-k (language, probability) for the whole document, best first."""
    return top_languages(*model.predict(one_line(text), k=k))


def top_languages(labels: Any, scores: Any) -> list[tuple[str, float]]:
    return [(label.removeprefix(LABEL_PREFIX), min(1.0, float(score))) for label, score in zip(labels, scores)]


def langid_decision(text: str, model: Any, config: LangIdConfig, wanted: tuple[str, ...] | None = None,
                    top: list[tuple[str, float]] | None = None) -> dict[str, Any]:
    """Keep/drop for one document: rule (None when kept), measured top score, threshold, languages.
    `wanted`: the languages kept from its source (default: the stage's `langs`); `top`: the model's answer
    for `text` when the caller predicted a batch at once (then `text` is the document's one line)."""
    wanted = config.langs if wanted is None else wanted
    if top is None:
        text = one_line(text)
        top = predict_languages(text, model, max(1, config.top_k)) if text else []
    if not text:
        return {"keep": False, "rule": "langid_empty_text", "lang": None, "score": 0.0, "threshold": config.min_score, "top": []}
    lang, score = top[0]
    decision = {"keep": True, "rule": None, "lang": lang, "score": score, "threshold": config.min_score, "top": top}
    if score <= config.min_score:
        decision.update(keep=False, rule="langid_low_score")
    elif "*" not in wanted and lang not in wanted:
        decision.update(keep=False, rule="langid_unwanted_lang")
    return decision


def batch_languages(lines: list[str], model: Any, k: int) -> list[list[tuple[str, float]]]:
    """Top-k languages of every non-empty line, one fastText call for the batch (an empty line: [])."""
    present = [line for line in lines if line]
    labels, scores = model.predict(present, k=k) if present else ([], [])
    answers = iter(map(top_languages, labels, scores))
    return [next(answers) if line else [] for line in lines]


def langid_shard(docs: pa.Table, config: LangIdConfig, context: Any = None) -> ShardOutcome:
    model = load_model(config.model_path)
    keep_mask: list[bool] = []
    langs: list[str | None] = []
    scores: list[float | None] = []
    audit: list[dict[str, Any]] = []
    wanted_by_source: dict[str, tuple[str, ...]] = {}
    measured: dict[str, list] = {name: [] for name in ("rule", "source", "id", "rank", "value", "threshold", "fired", "fires_when", "profile")}
    lines = one_lines(docs.column("text"))
    tops = batch_languages(lines, model, max(1, config.top_k))
    for doc_id, line, top, source in zip(docs.column("id").to_pylist(), lines, tops, docs.column("source").to_pylist()):
        wanted = wanted_by_source.get(source) or wanted_by_source.setdefault(source, config.wanted(source))
        decision = langid_decision(line, model, config, wanted, top)
        keep_mask.append(decision["keep"])
        langs.append(decision["lang"])
        scores.append(decision["score"])
        if decision["rule"] != "langid_empty_text":  # every other document had its score compared with min_score
            for name, value in (("rule", "langid_low_score"), ("source", source), ("id", doc_id), ("rank", doc_rank(doc_id)), ("value", decision["score"]),
                                ("threshold", config.min_score), ("fired", decision["rule"] == "langid_low_score"), ("fires_when", "<="), ("profile", "")):
                measured[name].append(value)
        if not decision["keep"]:
            detail = {"lang": decision["lang"], "top": [[lang, round(score, 4)] for lang, score in decision["top"]], "wanted": list(wanted)}
            audit.append({"id": doc_id, "action": "removed", "rule": decision["rule"], "value": decision["score"], "threshold": config.min_score, "detail": detail})
    labelled = docs.set_column(docs.schema.get_field_index("lang"), "lang", pa.array(langs, pa.string()))
    labelled = labelled.set_column(labelled.schema.get_field_index("lang_score"), "lang_score", pa.array(scores, pa.float32()))
    return ShardOutcome(labelled.filter(pa.array(keep_mask, pa.bool_())), audit, stats_rows(measured))


def model_digest(config: LangIdConfig) -> list[tuple[str, str]]:
    """The model file's sha256 joins the cache key: a replaced model recomputes the stage."""
    path = Path(config.model_path) if config.model_path else bundled_model_path()
    if not path.is_file():
        raise LangIdModelMissing(f"{path}: language-ID model file not found (langid.model_path)")
    return [(f"langid:{path.name}", model_sha256(str(path)))]


LANGID = StageDef(STAGE, VERSION, langid_shard, external_inputs=model_digest)


def run_langid(config: LangIdConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(LANGID, config, input_dir, out_dir, workers)

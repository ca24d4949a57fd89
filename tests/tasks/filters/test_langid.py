"""Language ID: the bundled lid.176 model on real snippets, the 0.65 boundary, and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from manifests.schema import docs_table
from tasks.filters import langid
from tasks.filters.langid import LangIdConfig, langid_decision, load_model
from tasks.runner.stage_runner import StageWriter, read_stage_audit, read_stage_docs

CONFIG = LangIdConfig()
ENGLISH = "The committee published its annual report on Tuesday.\nIt describes how the river basin was restored over ten years."
CHINESE = "数据清洗流程首先识别文档的语言，然后根据语言选择合适的质量规则。\n中文没有空格，所以需要字符级别的规则。"
GERMAN = "Die Regierung hat am Dienstag einen neuen Bericht über die Wasserversorgung der Städte veröffentlicht."


class FixedScoreModel:
    """A stand-in with the fastText predict signature that returns one fixed language and score."""

    def __init__(self, lang: str, score: float):
        self.lang, self.score = lang, score

    def predict(self, text: str, k: int = 1):
        assert "\n" not in text
        return (f"__label__{self.lang}",) + ("__label__xx",) * (k - 1), (self.score,) + (0.0,) * (k - 1)


def test_bundled_model_is_found_and_cached():
    path = langid.bundled_model_path()
    assert path.name == "lid.176.ftz" and path.is_file()
    assert load_model() is load_model()


def test_a_model_overwritten_at_the_same_path_is_loaded_again(tmp_path):
    """The cache follows the file's content (sha256), not its path: a long-lived worker must not keep the old model."""
    import os
    import shutil

    from tasks.filters.fasttext_model import load_fasttext, model_sha256
    from tasks.filters.quality_model import SAMPLE_MODEL

    path = tmp_path / "model.bin"
    shutil.copyfile(langid.bundled_model_path(), path)
    first = load_fasttext(str(path))
    assert load_fasttext(str(path)) is first
    first_digest = model_sha256(str(path))
    shutil.copyfile(SAMPLE_MODEL, tmp_path / "new.bin")
    os.replace(tmp_path / "new.bin", path)  # how a retrained model lands
    second = load_fasttext(str(path))
    assert second is not first and model_sha256(str(path)) != first_digest
    assert not any(label.startswith("__label__en") for label in second.get_labels())  # the quality model's labels now


def test_the_model_digest_is_in_the_cache_key(tmp_path):
    import shutil

    from tasks.filters.quality_model import SAMPLE_MODEL

    path = tmp_path / "lid.bin"
    shutil.copyfile(langid.bundled_model_path(), path)
    before = langid.model_digest(LangIdConfig(model_path=str(path)))
    shutil.copyfile(SAMPLE_MODEL, path)
    assert langid.model_digest(LangIdConfig(model_path=str(path))) != before


def test_missing_model_file_is_a_clear_error(tmp_path):
    with pytest.raises(langid.LangIdModelMissing, match="model file not found"):
        load_model(str(tmp_path / "nope.ftz"))


@pytest.mark.parametrize("text,lang,rule", [(ENGLISH, "en", None), (CHINESE, "zh", None), (GERMAN, "de", "langid_unwanted_lang")])
def test_real_model_on_whole_documents(text, lang, rule):
    decision = langid_decision(text, load_model(), CONFIG)
    assert decision["lang"] == lang and decision["score"] > 0.65 and decision["rule"] == rule


def test_score_threshold_is_strict():
    at = langid_decision("some text", FixedScoreModel("en", 0.65), CONFIG)
    above = langid_decision("some text", FixedScoreModel("en", 0.6501), CONFIG)
    assert (at["keep"], at["rule"], at["threshold"]) == (False, "langid_low_score", 0.65)
    assert above["keep"] and above["rule"] is None


def test_any_language_when_configured():
    assert langid_decision(GERMAN, load_model(), LangIdConfig(langs=("*",)))["keep"]


@pytest.mark.parametrize("text", ["", "   \n\t", "\x00\x01\x02"])
def test_empty_text_has_its_own_rule(text):
    decision = langid_decision(text, load_model(), CONFIG)
    assert decision["rule"] == "langid_empty_text" and not decision["keep"]


@pytest.mark.parametrize("text", ["😀🎉🔥" * 100, "x" * 5_000_000, ENGLISH + "\x00\x1b[31m" + CHINESE, "bad \ud800 surrogate " * 10,
                                  "使用 pip install numpy 安装 NumPy 库，然后 import numpy as np 即可。"])
def test_bad_input_gets_a_decision(text):
    decision = langid_decision(text, load_model(), CONFIG)
    assert decision["keep"] or decision["rule"] in ("langid_low_score", "langid_unwanted_lang")
    assert 0.0 <= decision["score"] <= 1.0


def test_stage_sets_lang_on_every_kept_document_and_audits_removals(tmp_path):
    rows = [
        {"id": i, "text": t, "source": "s", "url": "", "lang": None, "lang_score": None, "meta": {}}
        for i, t in [("en", ENGLISH), ("zh", CHINESE), ("de", GERMAN), ("empty", " ")]
    ]
    upstream = tmp_path / "02_extract"
    writer = StageWriter("extract", "test", {}, "key", [], upstream)
    writer.write_shard(0, docs_table(rows), [])
    writer.publish()
    manifest = langid.run_langid(CONFIG, upstream, tmp_path / "03_langid", workers=1)
    assert manifest.counts["removed"] == {"langid_empty_text": 1, "langid_unwanted_lang": 1}
    kept = {r["id"]: r for r in read_stage_docs(tmp_path / "03_langid").to_pylist()}
    assert kept["en"]["lang"] == "en" and kept["zh"]["lang"] == "zh" and kept["zh"]["lang_score"] > 0.65
    german = [r for r in read_stage_audit(tmp_path / "03_langid").to_pylist() if r["id"] == "de"][0]
    assert german["value"] > 0.65 and german["threshold"] == 0.65 and json.loads(german["detail"])["lang"] == "de"


def test_the_column_wise_one_line_is_one_line_of_each_document():
    """langid folds a batch's documents onto one line each with Arrow; that must be `one_line`'s text, byte for byte."""
    import random

    import pyarrow as pa

    from tasks.filters.fasttext_model import one_line, one_lines

    pieces = ["word ", "\n", "\r\n", "\t", "\x00", "\x1f", "\x7f", "\x85", "\x9f", "\u2028", "\u2029", "\xa0", "é", "数据", "  ", "\x0b"]
    rng = random.Random(3)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(2000)] + ["", "\n\n", ENGLISH]
    assert one_lines(pa.array(texts)) == [one_line(t) for t in texts]


def test_a_batch_scored_at_once_decides_as_one_document_at_a_time():
    """One fastText call per batch gives each document the decision and top-k it gets alone (empty texts included)."""
    model = load_model()
    texts = [ENGLISH, CHINESE, GERMAN, "", " \n\t ", "ok", "Le comité a publié son rapport annuel mardi."]
    docs = docs_table([{"id": f"d{i}", "text": t, "source": "s", "url": f"u{i}", "meta": {}} for i, t in enumerate(texts)])
    outcome = langid.langid_shard(docs, CONFIG)
    alone = [langid_decision(t, model, CONFIG) for t in texts]
    assert outcome.kept.column("id").to_pylist() == [f"d{i}" for i, d in enumerate(alone) if d["keep"]]
    assert outcome.kept.column("lang").to_pylist() == [d["lang"] for d in alone if d["keep"]]
    removed = {row["id"]: (row["rule"], row["detail"]["top"]) for row in outcome.audit}
    assert removed == {f"d{i}": (d["rule"], [[lang, round(score, 4)] for lang, score in d["top"]]) for i, d in enumerate(alone) if not d["keep"]}

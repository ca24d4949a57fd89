"""A source spec's `langs` is honoured by langid (issue 45, part 6): a source with langs = ["de"] keeps its
German documents, which another source loses; the pipeline fills the per-source lists from the specs."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from flows.config import PipelineConfig
from flows.stages import langid_config
from manifests.schema import docs_table
from manifests.sources import PACKAGE_DIR
from tasks.filters.langid import LangIdConfig, langid_shard


def german_texts(n: int) -> list[str]:
    rows = [json.loads(line) for line in (PACKAGE_DIR / "sample" / "multilingual" / "multilingual.jsonl").read_text(encoding="utf-8").splitlines()]
    return [r["text"] for r in rows if r["meta"].get("label_lang") == "de" and len(r["text"]) > 300][:n]


def test_a_source_keeps_its_own_languages_and_only_it() -> None:
    texts = german_texts(4)
    docs = docs_table([{"id": f"{source}-{i:016x}", "text": text, "source": source, "url": f"https://{source}/{i}", "meta": {}}
                       for source in ("de-news", "web") for i, text in enumerate(texts)])
    config = LangIdConfig(langs=("en",), source_langs={"de-news": ("de",), "web": ("en",)})
    outcome = langid_shard(docs, config)
    assert outcome.kept.column("source").to_pylist() == ["de-news"] * 4
    assert set(outcome.kept.column("lang").to_pylist()) == {"de"}
    assert [json.loads(json.dumps(row["detail"]))["wanted"] for row in outcome.audit] == [["en"]] * 4
    assert {row["rule"] for row in outcome.audit} == {"langid_unwanted_lang"}


def test_the_pipeline_fills_each_sources_langs_from_its_spec(tmp_path: Path) -> None:
    spec = tmp_path / "de-news.toml"
    spec.write_text('name = "de-news"\nkind = "jsonl"\npath = "x.jsonl"\norigin = "o"\nsnapshot = "s"\nlicense = "CC0-1.0"\nlangs = ["de"]\n', encoding="utf-8")
    config = PipelineConfig.model_validate({"sources": [str(spec), "generated"], "langid": {"langs": ["en"]}})
    filled = langid_config(config)
    assert filled.source_langs == {"de-news": ("de",), "generated": ("en",)}
    assert filled.wanted("de-news") == ("en", "de") and filled.wanted("other") == ("en",)
    spec.write_text(spec.read_text(encoding="utf-8").replace('langs = ["de"]\n', ""), encoding="utf-8")  # none declared: only [langid] langs
    assert langid_config(config.model_copy(update={"langid": LangIdConfig(langs=("de",))})).wanted("de-news") == ("de",)
    sample = PipelineConfig.model_validate({"sources": ["multilingual"], "langid": {"source_langs": {"multilingual": []}}})
    assert langid_config(sample).wanted("multilingual") == ("en", "zh")

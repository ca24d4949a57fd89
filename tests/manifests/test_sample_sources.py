import json
import re
import tomllib
from collections import Counter
from pathlib import Path

import pytest

import manifests

PACKAGE_DIR = Path(manifests.__file__).resolve().parent
SPEC_KEYS = {"name", "kind", "path", "glob", "url_prefix", "origin", "snapshot",
             "license", "profile", "langs", "description"}
KINDS = {"html_dir", "warc", "jsonl", "parquet", "text_dir", "hf_disk"}
PROFILES = {"web", "prose", "documentation", "code"}
SPEC_FILES = sorted((PACKAGE_DIR / "sources").glob("*.toml"))
MAX_SAMPLE_BYTES = 20 * 1024 * 1024


def load_spec(path):
    with open(path, "rb") as spec_file:
        return tomllib.load(spec_file)


def jsonl_records(spec):
    with open(PACKAGE_DIR / spec["path"], encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


@pytest.mark.parametrize("spec_path", SPEC_FILES, ids=lambda p: p.stem)
def test_source_spec_is_complete_and_points_at_data(spec_path):
    spec = load_spec(spec_path)
    assert set(spec) == SPEC_KEYS
    assert spec["name"] == spec_path.stem and re.fullmatch(r"[a-z0-9-]+", spec["name"])
    assert spec["kind"] in KINDS and spec["profile"] in PROFILES
    assert spec["origin"] and spec["snapshot"] and spec["license"] and spec["langs"]
    data = PACKAGE_DIR / spec["path"]
    if spec["kind"].endswith("_dir"):
        assert data.is_dir() and spec["glob"] and spec["url_prefix"]
        assert any(data.glob(spec["glob"]))
    else:
        assert data.is_file()
    if spec["kind"] == "jsonl":
        records = jsonl_records(spec)
        assert records
        for record in records:
            assert isinstance(record["text"], str) and record["text"].strip()
            assert isinstance(record.get("url", ""), str)
            assert isinstance(record.get("meta", {}), dict)
        urls = [r["url"] for r in records]
        assert len(urls) == len(set(urls))


def test_default_config_lists_existing_sources():
    with open(PACKAGE_DIR / "configs" / "sample.toml", "rb") as config_file:
        config = tomllib.load(config_file)
    # Besides the sources, the sample config only switches on the optional quality classifier stage, keeps
    # its 256-document shards, keeps only langid.langs from the multilingual source (whose spec lists all its
    # languages) and shortens the first pretrain to 24 updates (the newcomer's first result).
    assert set(config) <= {"run", "ingest", "quality_model", "langid", "pretrain"}
    assert config["ingest"] == {"docs_per_shard": 256}
    assert config["langid"] == {"source_langs": {"multilingual": []}}
    assert set(config.get("pretrain", {})) <= {"train"}
    assert config["pretrain"]["train"]["max_steps"] == 24
    assert set(config["run"]["sources"]) == {p.stem for p in SPEC_FILES}


def test_multilingual_has_enough_labelled_documents_per_language():
    spec = load_spec(PACKAGE_DIR / "sources" / "multilingual.toml")
    counts = Counter(r["meta"]["label_lang"] for r in jsonl_records(spec))
    assert counts["zh"] >= 60
    assert sum(n >= 30 for n in counts.values()) >= 5
    assert set(counts) == set(spec["langs"])


def test_prose_and_generator_pool_share_no_article():
    spec = load_spec(PACKAGE_DIR / "sources" / "prose-enwiki.toml")
    prose_titles = {r["meta"]["title"] for r in jsonl_records(spec)}
    pool_path = PACKAGE_DIR / "sample" / "generator_pool" / "enwiki.jsonl"
    with open(pool_path, encoding="utf-8") as lines:
        pool_titles = {json.loads(line)["meta"]["title"] for line in lines}
    assert prose_titles and pool_titles and not prose_titles & pool_titles


def test_bundled_sample_stays_small():
    total = sum(p.stat().st_size for p in (PACKAGE_DIR / "sample").rglob("*") if p.is_file())
    assert total <= MAX_SAMPLE_BYTES

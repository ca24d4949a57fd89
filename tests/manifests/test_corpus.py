import json

import pytest

from manifests.corpus import CorpusManifestError, read_corpus_manifest, source_of_id, validate_corpus, write_corpus_manifest

MINIMAL = {"dtype": "uint16", "tokenizer": {"vocab_size": 512}, "sources": [], "mixture": {}, "validation": {},
           "shards": {"train": [{"path": "tokens/train-00000.bin", "sha256": "ab", "tokens": 3, "index_path": "i", "index_sha256": "cd"}], "validation": []}}


def test_written_manifest_reads_back_with_its_digest(tmp_path):
    written = write_corpus_manifest(tmp_path / "corpus.json", MINIMAL)
    assert read_corpus_manifest(tmp_path) == written
    assert len(written["digest"]) == 64


def test_tampered_content_is_refused(tmp_path):
    write_corpus_manifest(tmp_path / "corpus.json", MINIMAL)
    payload = json.loads((tmp_path / "corpus.json").read_text())
    payload["shards"]["train"][0]["tokens"] = 4
    (tmp_path / "corpus.json").write_text(json.dumps(payload))
    with pytest.raises(CorpusManifestError, match="digest"):
        read_corpus_manifest(tmp_path / "corpus.json")


def test_bad_dtype_and_incomplete_shard_entries_are_named(tmp_path):
    with pytest.raises(CorpusManifestError, match="int8"):
        write_corpus_manifest(tmp_path / "c.json", {**MINIMAL, "dtype": "int8"})
    broken = {**MINIMAL, "shards": {"train": [{"path": "tokens/x.bin", "tokens": 1}]}}
    with pytest.raises(CorpusManifestError, match="tokens/x.bin.*sha256"):
        write_corpus_manifest(tmp_path / "c.json", broken)
    with pytest.raises(CorpusManifestError, match="lacks"):
        validate_corpus({"dtype": "uint16"}, "here")


def test_missing_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusManifestError, match="no corpus.json"):
        read_corpus_manifest(tmp_path)


def test_source_of_id_keeps_dashes_in_source_names():
    assert source_of_id("python-docs-warc-0123456789abcdef") == "python-docs-warc"


def test_pipeline_corpus_records_provenance_and_filters(tiny_run):
    corpus = read_corpus_manifest(tiny_run)
    prose = next(s for s in corpus["sources"] if s["source"] == "prose")
    assert prose["license"] == "CC0-1.0" and prose["origin"] == "test://prose" and prose["snapshot"] == "2026-11-29"
    assert prose["filters"]["dedup_fuzzy.near_duplicate"]["removed"] == 6
    assert prose["documents_ingested"] == 66
    assert prose["train_documents"] + prose["validation_documents"] == 60
    assert corpus["validation"]["documents"] == sum(s["validation_documents"] for s in corpus["sources"])

from __future__ import annotations

import json
import random
import string

import numpy as np
import pyarrow.parquet as pq
import pytest

import tasks.dedup.fuzzy as dedup_fuzzy
import tasks.dedup.near_dup_files as near_dup_files
from manifests.stage_manifest import read_manifest
from tasks.dedup.fuzzy import DedupFuzzyConfig, fallback_pairs, run_dedup_fuzzy
from tasks.dedup.minhash import ChecksumMismatch
from tasks.dedup.shingles import TokenHashCache, batch_ngram_hashes, jaccard_of_sets, tokens
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs

RNG = random.Random(7)
VOCAB = ["".join(RNG.choice(string.ascii_lowercase) for _ in range(RNG.randint(3, 9))) for _ in range(3000)]


def story(words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(words))


def edited(text: str, rate: float, rng: random.Random) -> str:
    return " ".join("river" if rng.random() < rate else word for word in text.split())


def true_jaccard(a: str, b: str) -> float:
    cache = TokenHashCache()
    hashes, offsets = batch_ngram_hashes([tokens(a), tokens(b)], 5, cache)
    return jaccard_of_sets(np.unique(hashes[: offsets[1]]), np.unique(hashes[offsets[1]:]))


@pytest.fixture(scope="module")
def corpus() -> dict[str, str]:
    rng = random.Random(11)
    texts = {f"doc-{i:03d}": story(200, rng) for i in range(40)}
    for i in range(10):  # near copies, lightly and heavily edited
        texts[f"zcopy-{i:03d}"] = edited(texts[f"doc-{i:03d}"], 0.01 if i < 6 else 0.2, rng)
    texts["chain-b"] = edited(texts["doc-020"], 0.015, rng)  # doc-020 ~ chain-b ~ chain-c, doc-020 !~ chain-c
    texts["chain-c"] = edited(texts["chain-b"], 0.015, rng)
    return texts


def removed_rows(stage_dir) -> dict[str, dict]:
    audit = read_stage_audit(stage_dir).to_pylist()
    return {row["id"]: {**row, "detail": json.loads(row["detail"])} for row in audit}


def test_fallback_pairs_are_linear_and_reach_every_member():
    pairs = list(fallback_pairs(list(range(1000))))
    assert len(pairs) < 2 * 1000 and all(a < b for a, b in pairs)
    assert {b for a, b in pairs if a == 0} == set(range(1, 1000))


def test_removes_verified_near_copies_keeps_smallest_id_and_records_jaccard(tmp_path, upstream, corpus):
    manifest = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus, shards=3), tmp_path / "fuzzy", workers=1)
    removed = removed_rows(tmp_path / "fuzzy")
    expected = {doc_id for doc_id in corpus if doc_id.startswith("zcopy-") and true_jaccard(corpus[doc_id], corpus["doc-" + doc_id[6:]]) >= 0.8}
    assert expected and expected <= set(removed)
    for doc_id, row in removed.items():
        assert row["rule"] == "near_duplicate" and row["threshold"] == 0.8
        detail = row["detail"]
        assert set(detail) == {"cluster_id", "kept_id", "matched_id", "jaccard"}
        assert detail["kept_id"] < doc_id and detail["jaccard"] >= 0.8 and row["value"] == pytest.approx(detail["jaccard"])
        assert true_jaccard(corpus[doc_id], corpus[detail["matched_id"]]) == pytest.approx(detail["jaccard"])
    # heavily edited copies fall below the threshold and stay
    for i in range(6, 10):
        if true_jaccard(corpus[f"zcopy-{i:03d}"], corpus[f"doc-{i:03d}"]) < 0.8:
            assert f"zcopy-{i:03d}" not in removed
    # the chain joins one cluster through chain-b, kept by its smallest id ("chain-b" < "doc-020")
    assert true_jaccard(corpus["doc-020"], corpus["chain-c"]) < 0.8 <= true_jaccard(corpus["doc-020"], corpus["chain-b"])
    assert removed["doc-020"]["detail"]["kept_id"] == removed["chain-c"]["detail"]["kept_id"] == "chain-b"
    clusters = pq.read_table(tmp_path / "fuzzy" / "clusters.parquet").to_pylist()
    members = {row["id"]: row for row in clusters}
    assert set(removed) < set(members) and all(row["kept_id"] == row["cluster_id"] for row in clusters)
    assert any(o.path == "clusters.parquet" and o.kind == "artifact" for o in read_manifest(tmp_path / "fuzzy").outputs)
    assert manifest.counts["removed"] == {"near_duplicate": len(removed)}
    assert not (tmp_path / "fuzzy" / "_spill").exists()


def test_one_shard_and_seven_shards_remove_the_same_documents(tmp_path, upstream, corpus):
    one = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus, 1, "one"), tmp_path / "f1", workers=1)
    seven = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(dict(reversed(list(corpus.items()))), 7, "seven"), tmp_path / "f7", workers=2)
    assert removed_rows(tmp_path / "f1") == removed_rows(tmp_path / "f7")
    assert one.counts["removed"] == seven.counts["removed"]


def test_empty_documents_never_enter_buckets(tmp_path, upstream):
    texts = {f"empty-{i}": "" for i in range(20)} | {f"short-{i}": "two words" for i in range(5)}
    manifest = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(texts), tmp_path / "fuzzy", workers=1)
    assert manifest.counts["kept"] == 25 and manifest.counts["removed"] == {}
    assert manifest.extra["context"]["documents_without_shingles"] == 25


def test_one_huge_document_and_chinese_near_copies(tmp_path, upstream):
    rng = random.Random(3)
    chinese = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴急"
    base = "".join(rng.choice(chinese) for _ in range(400))
    near = base[:395] + "天地人和"
    huge = story(200_000, rng)
    texts = {"zh-a": base, "zh-b": near, "zh-c": "".join(rng.choice(chinese) for _ in range(400)), "huge": huge, "huge-copy": huge + " river"}
    run_dedup_fuzzy(DedupFuzzyConfig(), upstream(texts), tmp_path / "fuzzy", workers=1)
    removed = removed_rows(tmp_path / "fuzzy")
    assert set(removed) == {"zh-b", "huge-copy"}
    assert removed["zh-b"]["detail"]["kept_id"] == "zh-a" and removed["zh-b"]["value"] > 0.95
    assert tokens("中文 and text")[:2] == ["中", "文"]  # characters are the tokens of space-less scripts


def test_hundred_thousand_identical_documents_form_one_cluster(tmp_path, upstream):
    text = "the same boilerplate page copied onto every site of the web"
    texts = {f"page-{i:06d}": text for i in range(100_000)}
    manifest = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(texts, shards=4), tmp_path / "fuzzy", workers=2)
    assert manifest.counts["kept"] == 1 and read_stage_docs(tmp_path / "fuzzy").column("id").to_pylist() == ["page-000000"]
    stats = manifest.extra["context"]
    assert stats["clusters"] == 1 and stats["verified_pairs"] == 0  # identical sets are folded, never paired
    # checked once per key partition that holds one of the 14 bands' buckets, not once per band
    assert 99_999 <= stats["folded_identical"] <= min(stats["partitions"], 14) * 99_999 and stats["partitions"] < 14


def test_corrupt_band_file_fails_clearly_and_publishes_nothing(tmp_path, upstream, corpus, monkeypatch):
    original = dedup_fuzzy.signature_shard

    def corrupting(shard_path, shard, config, spill_dir, partitions, *rest):
        result = original(shard_path, shard, config, spill_dir, partitions, *rest)
        with open(result["bands_file"], "r+b") as handle:
            handle.seek(-8, 2)
            handle.write(b"\x00" * 8)
        return result

    monkeypatch.setattr(dedup_fuzzy, "signature_shard", corrupting)
    with pytest.raises(ChecksumMismatch, match=r"part-00000\.bands\.npy.*corrupt"):
        run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus), tmp_path / "fuzzy", workers=1)
    assert not (tmp_path / "fuzzy").exists() and not (tmp_path / ".fuzzy.partial").exists()


def test_bad_config_is_refused(tmp_path, upstream, corpus):
    with pytest.raises(ValueError, match="jaccard_threshold"):
        run_dedup_fuzzy(DedupFuzzyConfig(jaccard_threshold=1.5), upstream(corpus), tmp_path / "fuzzy", workers=1)


def test_memory_bounds_do_not_change_the_result(tmp_path, upstream, corpus, monkeypatch):
    """Tiny hashing batches and a shingle-set cache of one entry give the same removals as the defaults."""
    default = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus, 3, "default"), tmp_path / "default", workers=1)
    monkeypatch.setattr(dedup_fuzzy, "SIGNATURE_BATCH_ROWS", 3)
    monkeypatch.setattr(near_dup_files, "SHINGLE_SET_CACHE_BYTES", 1)
    bounded = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus, 3, "bounded"), tmp_path / "bounded", workers=1)
    assert removed_rows(tmp_path / "bounded") == removed_rows(tmp_path / "default") and default.counts["removed"]
    assert bounded.extra["context"]["verified_pairs"] == default.extra["context"]["verified_pairs"]
    assert pq.read_table(tmp_path / "bounded" / "clusters.parquet").equals(pq.read_table(tmp_path / "default" / "clusters.parquet"))


def test_verification_reads_one_span_row_per_lookup_never_the_whole_file(tmp_path, upstream, corpus, monkeypatch):
    """Bytes held, counted: a bucket or verification task reads spans.npy a 24-byte row at a time (2.4 GB at 100M documents)."""
    from tasks.dedup.spill_reader import SpillFiles

    span_reads = []
    real_read = SpillFiles.read

    def counting_read(self, path, start, stop):
        if path.endswith("spans.npy"):
            span_reads.append(stop - start)
        return real_read(self, path, start, stop)

    monkeypatch.setattr(SpillFiles, "read", counting_read)
    baseline = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus, shards=3, name="a"), tmp_path / "fuzzy", workers=1)
    assert span_reads and set(span_reads) == {3}  # one row (shard, first, last + 1) per lookup
    assert baseline.counts["removed"]["near_duplicate"] > 0

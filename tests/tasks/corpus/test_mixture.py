import numpy as np
import pyarrow as pa
import pytest

import pyarrow.parquet as pq

import tasks.corpus.repeat_plan as repeat_plan
from tasks.corpus.mixture import MixtureConfig, plan_ranked, source_weights, temperature_shares
from tasks.corpus.repeat_plan import COUNT_SCHEMA, rank_counts


def corpus(sizes):
    """sizes: {(source, lang): (n_docs, tokens_per_doc)}"""
    rows = [{"id": f"{s}-{l}-{i}", "source": s, "lang": l, "tokens": n} for (s, l), (count, n) in sizes.items() for i in range(count)]
    return pa.Table.from_pylist(rows, schema=COUNT_SCHEMA)


@pytest.fixture
def plan_mixture(tmp_path):
    """Counts (one table, or one per shard) through the mixture's planning tasks: (the plan in shard order, the realised table)."""
    calls = iter(range(1_000))

    def plan(counts, config: MixtureConfig, workers: int = 1):
        work = tmp_path / f"plan-{next(calls)}"
        work.mkdir()
        shards = counts if isinstance(counts, list) else [counts]
        ranked = [rank_counts(table, f"part-{i:05d}", i, config.seed, str(work)) for i, table in enumerate(shards)]
        parts, table, _ = plan_ranked(ranked, config, work, workers)
        return pa.concat_tables([pq.read_table(work / path) for path, *_ in parts]), table
    return plan


def test_epochs_follow_w_d_over_u(plan_mixture):
    docs = corpus({("a", "en"): (10, 100), ("b", "en"): (10, 100)})  # U_a = U_b = 1,000
    plan, table = plan_mixture(docs, MixtureConfig(weights={"a": 0.75, "b": 0.25}, total_tokens=4000))
    rows = {r["name"]: r for r in table["sources"]}
    assert rows["a"]["epochs"] == 3.0 and rows["a"]["tokens_contributed"] == 3000
    assert rows["b"]["epochs"] == 1.0 and rows["b"]["tokens_contributed"] == 1000
    assert table["shortfall_tokens"] == 0
    assert sum(p["repeats"] * p["tokens"] for p in plan.to_pylist()) == 4000


def test_epochs_capped_and_shortfall_reported(plan_mixture):
    docs = corpus({("small", "en"): (5, 100), ("big", "en"): (100, 100)})  # U_small = 500
    _, table = plan_mixture(docs, MixtureConfig(weights={"small": 0.5, "big": 0.5}, total_tokens=10_000, max_epochs=4))
    small = next(r for r in table["sources"] if r["name"] == "small")
    assert small["capped"] and small["epochs"] == 4.0
    assert small["tokens_contributed"] == 2000 and small["shortfall_tokens"] == 3000
    assert table["shortfall_tokens"] == 3000 and table["tokens_contributed"] == 7000


def test_fractional_epochs_are_deterministic_and_whole_documents(plan_mixture):
    docs = corpus({("a", "en"): (20, 10)})

    def repeats(table, seed):
        plan, table_out = plan_mixture(table, MixtureConfig(total_tokens=300, seed=seed))
        return dict(zip(plan.column("id").to_pylist(), plan.column("repeats").to_pylist())), table_out["sources"][0]["epochs"]

    first, epochs = repeats(docs, seed=3)
    assert epochs == 1.5
    assert first == repeats(docs.take(list(reversed(range(20)))), seed=3)[0]
    assert sorted(set(first.values())) == [1, 2] and sum(first.values()) * 10 == 300
    assert first != repeats(docs, seed=4)[0]


def reference_repeats(table: pa.Table, target: float, max_epochs: float, seed: int) -> list[int]:
    """The definition, in memory: ⌊e⌋ each, one more in (seeded rank, position) order while the tokens given one are below the fraction's."""
    tokens = table.column("tokens").to_numpy()
    unique = int(tokens.sum())
    epochs = min(target / unique, max_epochs)
    order = np.lexsort((np.arange(len(tokens)), repeat_plan.document_ranks(table.column("id").to_pylist(), seed)))
    taken_before = np.cumsum(tokens[order]) - tokens[order]
    repeats = np.full(len(tokens), int(epochs))
    repeats[order[taken_before < (epochs - int(epochs)) * unique]] += 1
    return repeats.tolist()


def test_the_prefix_found_by_bins_and_blocks_is_the_in_memory_one(plan_mixture, monkeypatch):
    """Random lengths over three shards, bins of one rank bit and blocks of 7 rows: every cut falls inside a bin
    that spans shards and blocks, and the repeats still equal the in-memory definition."""
    monkeypatch.setattr(repeat_plan, "COUNT_BLOCK_ROWS", 7)
    monkeypatch.setattr(repeat_plan, "RANK_BINS", 2)
    monkeypatch.setattr(repeat_plan, "BIN_SHIFT", np.uint64(63))
    rng = np.random.default_rng(4)
    rows = [{"id": f"d{i:03d}", "source": "s", "lang": "en", "tokens": int(n)} for i, n in enumerate(rng.integers(1, 50, size=90))]
    whole = pa.Table.from_pylist(rows, schema=COUNT_SCHEMA)
    for target_epochs in (0.3, 1.62, 2.97):
        target = target_epochs * int(whole.column("tokens").to_numpy().sum())
        plan, _ = plan_mixture([whole.slice(0, 25), whole.slice(25, 40), whole.slice(65)], MixtureConfig(total_tokens=round(target), seed=2))
        assert plan.column("repeats").to_pylist() == reference_repeats(whole, round(target), 4.0, seed=2), target_epochs


def test_natural_weights_when_none_given():
    assert source_weights({"a": 300, "b": 100}, {}) == {"a": 0.75, "b": 0.25}


def test_weights_must_cover_every_source():
    with pytest.raises(ValueError, match=r"without a weight \['b'\]"):
        source_weights({"a": 1, "b": 1}, {"a": 1.0})
    with pytest.raises(ValueError, match=r"training\) \['c'\]"):
        source_weights({"a": 1}, {"a": 1.0, "c": 1.0})


def test_temperature_flattens_language_shares():
    shares = temperature_shares({"en": 900.0, "zh": 100.0}, alpha=0.3)
    assert shares["zh"] == pytest.approx(0.1 ** 0.3 / (0.9 ** 0.3 + 0.1 ** 0.3))
    assert 0.1 < shares["zh"] < 0.5
    assert temperature_shares({"en": 900.0, "zh": 100.0}, alpha=1.0)["zh"] == pytest.approx(0.1)


def test_temperature_sampling_upsamples_low_resource_language(plan_mixture):
    docs = corpus({("web", "en"): (90, 100), ("web", "zh"): (10, 100)})
    _, natural = plan_mixture(docs, MixtureConfig(total_tokens=10_000))
    _, tempered = plan_mixture(docs, MixtureConfig(total_tokens=10_000, temperature_alpha=0.3))
    zh = lambda t: next(r for r in t["languages"] if r["name"] == "zh")
    assert zh(natural)["tokens_contributed"] == 1000
    assert zh(tempered)["tokens_contributed"] > 2500 and zh(tempered)["epochs"] > 2.5


def test_training_side_is_tokenised_by_shard_tasks_not_the_flow_host(tiny_run, tmp_path, monkeypatch):
    """The flow host only joins the workers' token files: the same bytes as one process encoding everything in order."""
    import tasks.corpus.encoding
    from tasks.corpus.mixture import PLAN_DIR, TOKENS_FILE, run_mixture
    from tasks.runner.stage_runner import StageWriter, read_stage_docs

    docs = read_stage_docs(tiny_run / "04_split")
    writer = StageWriter("split", "test", {}, "split-in-three", [], tmp_path / "04_split")
    third = docs.num_rows // 3
    for index, start in enumerate((0, third, 2 * third)):
        writer.write_shard(index, docs.slice(start, third if index < 2 else docs.num_rows - start), [])
    writer.publish()
    config = MixtureConfig(weights={"prose": 0.5, "mixed": 0.5}, total_tokens=30_000, max_epochs=4.0)
    reference = run_mixture(config, tmp_path / "04_split", tiny_run / "05_tokenizer", tmp_path / "one_process", workers=1)

    def no_encoding_here(*args, **kwargs):
        raise AssertionError("the flow host tokenised a document")

    monkeypatch.setattr(tasks.corpus.encoding, "encode_texts", no_encoding_here)  # spawned workers import their own copy
    manifest = run_mixture(config, tmp_path / "04_split", tiny_run / "05_tokenizer", tmp_path / "06_mixture", workers=2)
    digest = {f.path: f.sha256 for f in manifest.outputs}
    assert digest == {f.path: f.sha256 for f in reference.outputs}  # plan, table and token stream identical
    assert digest[TOKENS_FILE] and not list((tmp_path / "06_mixture").glob("_*"))  # per-shard token and rank files removed
    assert sorted(p for p in digest if p.startswith(PLAN_DIR)) == [f"{PLAN_DIR}/part-0000{i}.parquet" for i in range(3)]


def test_the_planning_process_holds_no_per_document_data(tmp_path):
    """8x the documents in 8x the shards: the host's peak, while the plan is decided by tasks in workers, grows by a
    few records per shard, not by the documents (the in-memory plan held ids, ranks and repeats: over 100 B a document)."""
    import tracemalloc

    def host_peak(documents: int) -> int:
        work = tmp_path / f"docs-{documents}"
        work.mkdir()
        rows = [{"id": f"doc-{i:07d}", "source": "s", "lang": "en", "tokens": 10 + i % 7} for i in range(documents)]
        table = pa.Table.from_pylist(rows, schema=COUNT_SCHEMA)
        ranked = [rank_counts(table.slice(start, 1_000), f"part-{start // 1_000:05d}", start // 1_000, 0, str(work))
                  for start in range(0, documents, 1_000)]
        tracemalloc.start()
        try:
            parts, _, _ = plan_ranked(ranked, MixtureConfig(total_tokens=int(2.4 * sum(r.tokens for r in ranked))), work, workers=2)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert sum(rows for _, rows, _ in parts) == documents
        return peak

    host_peak(2_000)  # imports and the worker pool, once
    small, large = host_peak(4_000), host_peak(32_000)
    assert (large - small) / 28_000 < 16, (small, large)


def test_a_tokenising_task_digests_its_token_file_as_it_writes_it(tiny_run, tmp_path, monkeypatch):
    """The sha256 the joining task checks the file against is that of the bytes on disk, taken from the bytes as they were
    written: the file is not read back to hash it."""
    import hashlib

    import tasks.corpus.mixture as mixture
    from manifests.digest import sha256_file
    from manifests.stage_manifest import read_manifest

    split = read_manifest(tiny_run / "04_split")
    shard = split.files("data")[0]
    tokenizer = tiny_run / "05_tokenizer" / "tokenizer.json"
    hashed = []
    monkeypatch.setattr(mixture, "sha256_file", lambda path: hashed.append(str(path)) or sha256_file(path))
    out = tmp_path / "part.tokens"
    result = mixture.encode_shard_side(str(split.path_of(shard)), "part-00000", "train", str(tokenizer), sha256_file(tokenizer), str(out))
    assert result["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest() and out.stat().st_size > 1000
    assert str(out) not in hashed

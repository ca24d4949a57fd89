import numpy as np
import pyarrow as pa
import pytest

from tasks.corpus.mixture import COUNT_SCHEMA, MixtureConfig, plan_mixture, repeats_for_group, seeded_ranks, source_weights, temperature_shares


def corpus(sizes):
    """sizes: {(source, lang): (n_docs, tokens_per_doc)}"""
    rows = [{"id": f"{s}-{l}-{i}", "source": s, "lang": l, "tokens": n} for (s, l), (count, n) in sizes.items() for i in range(count)]
    return pa.Table.from_pylist(rows, schema=COUNT_SCHEMA)


def test_epochs_follow_w_d_over_u():
    docs = corpus({("a", "en"): (10, 100), ("b", "en"): (10, 100)})  # U_a = U_b = 1,000
    plan, table = plan_mixture(docs, MixtureConfig(weights={"a": 0.75, "b": 0.25}, total_tokens=4000))
    rows = {r["name"]: r for r in table["sources"]}
    assert rows["a"]["epochs"] == 3.0 and rows["a"]["tokens_contributed"] == 3000
    assert rows["b"]["epochs"] == 1.0 and rows["b"]["tokens_contributed"] == 1000
    assert table["shortfall_tokens"] == 0
    assert sum(p["repeats"] * p["tokens"] for p in plan.to_pylist()) == 4000


def test_epochs_capped_and_shortfall_reported():
    docs = corpus({("small", "en"): (5, 100), ("big", "en"): (100, 100)})  # U_small = 500
    _, table = plan_mixture(docs, MixtureConfig(weights={"small": 0.5, "big": 0.5}, total_tokens=10_000, max_epochs=4))
    small = next(r for r in table["sources"] if r["name"] == "small")
    assert small["capped"] and small["epochs"] == 4.0
    assert small["tokens_contributed"] == 2000 and small["shortfall_tokens"] == 3000
    assert table["shortfall_tokens"] == 3000 and table["tokens_contributed"] == 7000


def test_fractional_epochs_are_deterministic_and_whole_documents():
    ids, tokens = [f"d{i}" for i in range(20)], np.full(20, 10)

    def repeats(order, seed):
        counts, epochs = repeats_for_group(seeded_ranks([ids[i] for i in order], seed), tokens[order], target=300, max_epochs=4)
        return {ids[i]: int(c) for i, c in zip(order, counts)}, epochs

    first, epochs = repeats(list(range(20)), seed=3)
    assert epochs == 1.5
    assert first == repeats(list(reversed(range(20))), seed=3)[0]
    assert sorted(set(first.values())) == [1, 2] and sum(first.values()) * 10 == 300
    assert first != repeats(list(range(20)), seed=4)[0]


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


def test_temperature_sampling_upsamples_low_resource_language():
    docs = corpus({("web", "en"): (90, 100), ("web", "zh"): (10, 100)})
    _, natural = plan_mixture(docs, MixtureConfig(total_tokens=10_000))
    _, tempered = plan_mixture(docs, MixtureConfig(total_tokens=10_000, temperature_alpha=0.3))
    zh = lambda t: next(r for r in t["languages"] if r["name"] == "zh")
    assert zh(natural)["tokens_contributed"] == 1000
    assert zh(tempered)["tokens_contributed"] > 2500 and zh(tempered)["epochs"] > 2.5


def test_training_side_is_tokenised_by_shard_tasks_not_the_flow_host(tiny_run, tmp_path, monkeypatch):
    """The flow host only joins the workers' token files: the same bytes as one process encoding everything in order."""
    import tasks.corpus.encoding
    from tasks.corpus.mixture import TOKENS_FILE, run_mixture
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
    assert digest[TOKENS_FILE] and not list((tmp_path / "06_mixture").glob("_tokens*"))  # per-shard files removed

from tasks.corpus.tokenizer import BYTE_TOKENS, EOS_TOKEN, TokenizerConfig, build_tokenizer, load_tokenizer, round_trip_failures, vocab_size_of

TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "数据清洗之后，语料由多个来源组成。每个来源都有唯一词元。",
    "Emoji survive: 🙂 🚀 👩‍💻 and tabs\tand\nnew lines  with  double spaces.",
    "def f(x):\n    return x ** 2  # code too\n",
] * 5


def test_round_trip_is_lossless_for_chinese_emoji_and_whitespace():
    tokenizer = build_tokenizer(TEXTS, TokenizerConfig(vocab_size=300, min_frequency=1))
    unseen = ["Ünïcödé ∑ 𝔘 — ünseen 漢字 🦄 \u200b zero width", "  leading spaces and trailing  "]
    assert round_trip_failures(tokenizer, [str(i) for i in range(len(TEXTS + unseen))], TEXTS + unseen) == []


def test_literal_special_token_in_a_document_stays_text():
    tokenizer = build_tokenizer(TEXTS, TokenizerConfig(vocab_size=300, min_frequency=1))
    text = f"a page quoting {EOS_TOKEN} literally"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.token_to_id(EOS_TOKEN) not in ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_vocab_padded_to_multiple_of_64_with_specials_first():
    config = TokenizerConfig(vocab_size=300, min_frequency=1)
    tokenizer = build_tokenizer(TEXTS, config)
    assert vocab_size_of(tokenizer) % 64 == 0
    for expected_id, token in enumerate(config.special_tokens):
        assert tokenizer.token_to_id(token) == expected_id


def test_byte_fallback_layout_appends_256_byte_ids():
    tokenizer = build_tokenizer(TEXTS, TokenizerConfig(vocab_size=320, min_frequency=1, byte_fallback_layout=True))
    first = tokenizer.token_to_id(BYTE_TOKENS[0])
    assert tokenizer.token_to_id(BYTE_TOKENS[255]) == first + 255
    assert vocab_size_of(tokenizer) % 64 == 0


def test_saved_tokenizer_keeps_ids_and_special_token_handling(tmp_path):
    tokenizer = build_tokenizer(TEXTS, TokenizerConfig(vocab_size=300, min_frequency=1))
    tokenizer.save(str(tmp_path / "t.json"))
    loaded = load_tokenizer(tmp_path / "t.json")
    text = TEXTS[2] + EOS_TOKEN
    assert loaded.encode(text).ids == tokenizer.encode(text).ids


def test_stage_publishes_tokenizer_with_hash_and_compression_per_source(tiny_run):
    from manifests.digest import sha256_file
    from manifests.stage_manifest import read_manifest

    manifest = read_manifest(tiny_run / "05_tokenizer")
    identity = manifest.extra["tokenizer"]
    assert identity["sha256"] == sha256_file(tiny_run / "05_tokenizer" / "tokenizer.json")
    assert identity["vocab_size"] % 64 == 0 and identity["eos_id"] == 0
    stats = manifest.extra["sample_by_source"]
    assert set(stats) == {"prose", "mixed"}
    # English prose compresses better than the Chinese-heavy mixed source
    assert stats["prose"]["chars_per_token"] > stats["mixed"]["chars_per_token"]




def test_tokenizer_sample_reads_texts_only_of_chosen_documents_and_matches_the_in_memory_rule(tmp_path):
    """Ranks and lengths first, then the chosen texts: the sample equals 'sort every training doc by seeded rank, take
    until the source's share of the budget' computed over all texts in memory."""
    import json
    import random

    import pyarrow as pa

    from manifests.schema import DOC_SCHEMA
    from tasks.corpus.split import seeded_rank
    from tasks.runner.stage_runner import StageWriter
    from tasks.corpus.tokenizer import sample_mixture

    rng = random.Random(3)
    docs = [(f"d{i:04d}", rng.choice(["web", "code"]), "word " * rng.randint(5, 400), rng.random() < 0.1) for i in range(300)]
    writer = StageWriter("split", "test", {}, "test-split", [], tmp_path / "split")
    for shard in range(3):
        part = docs[shard::3]
        n = len(part)
        writer.write_shard(shard, pa.table({"id": [d[0] for d in part], "text": [d[2] for d in part], "source": [d[1] for d in part],
                                            "url": [d[0] for d in part], "lang": pa.nulls(n, pa.string()), "lang_score": pa.nulls(n, pa.float32()),
                                            "meta": [json.dumps({"split": "validation" if d[3] else "train"}) for d in part]},
                                           schema=DOC_SCHEMA), [])
    writer.publish()
    config = TokenizerConfig(sample_chars=20_000, seed=7)
    weights = {"web": 3.0, "code": 1.0}
    sample = sample_mixture(tmp_path / "split", weights, config)
    train = [d for d in docs if not d[3]]
    budget = min(config.sample_chars, sum(len(d[2]) for d in train))
    for source, weight in weights.items():
        ordered = sorted((seeded_rank(config.seed, d[0]), d[0], d[2]) for d in train if d[1] == source)
        ids, texts, taken = [], [], 0
        for _, doc_id, text in ordered:
            if taken >= weight / sum(weights.values()) * budget:
                break
            ids, texts, taken = ids + [doc_id], texts + [text], taken + len(text)
        assert sample[source] == (ids, texts) and 0 < len(ids) < len(ordered)


def test_tokenizer_sample_passes_are_shard_tasks_returning_only_the_sample(tmp_path, monkeypatch):
    """Counting rows: the flow host receives the sampled documents (and the few sharing the last rank bucket), not the corpus."""
    import json

    import pyarrow as pa

    from manifests.schema import DOC_SCHEMA
    from tasks.corpus import tokenizer as tok
    from tasks.runner.stage_runner import StageWriter

    writer = StageWriter("split", "test", {}, "test-split", [], tmp_path / "split")
    for shard in range(4):
        n = 250
        writer.write_shard(shard, pa.table({"id": [f"s{shard}-{i:04d}" for i in range(n)], "text": ["word " * 40] * n,
                                            "source": ["web" if i % 4 else "code" for i in range(n)], "url": [""] * n,
                                            "lang": pa.nulls(n, pa.string()), "lang_score": pa.nulls(n, pa.float32()),
                                            "meta": [json.dumps({"split": "train"})] * n}, schema=DOC_SCHEMA), [])
    writer.publish()
    returned = []
    real = tok.shard_sample_rows

    def counting(*args):
        result = real(*args)
        returned.append(len(result["rows"]))
        return result

    monkeypatch.setattr(tok, "shard_sample_rows", counting)
    sample = tok.sample_mixture(tmp_path / "split", {"web": 1.0, "code": 0.0}, TokenizerConfig(sample_chars=20_000, seed=1), workers=1)
    assert len(returned) == 4  # one task per shard
    assert len(sample["web"][0]) == 100 and sample["code"] == ([], [])  # 200 characters a document; code's weight is 0
    assert sum(returned) <= len(sample["web"][0]) + 2  # of 1,000 documents (a bucket holds ~1/65,536 of a source)
    everything = tok.sample_mixture(tmp_path / "split", {}, TokenizerConfig(sample_chars=10**9, seed=1), workers=1)
    assert sum(len(ids) for ids, _ in everything.values()) == 1000  # a budget above the corpus takes it all


def test_an_adopted_tokenizer_is_published_as_it_is_without_training_and_keyed_by_its_content(tiny_run, tmp_path, monkeypatch):
    """tokenizer.from_file: no BPE training; the file itself is published (same sha256), with its provenance, checked
    for round trip on a small sample; a changed file (same path) recomputes the stage."""
    import shutil

    from manifests.digest import sha256_file
    from manifests.stage_manifest import read_manifest
    from tasks.corpus import tokenizer as tok

    source = tmp_path / "base" / "tokenizer.json"
    source.parent.mkdir()
    shutil.copyfile(tiny_run / "05_tokenizer" / "tokenizer.json", source)
    monkeypatch.setattr(tok, "build_tokenizer", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained a BPE")))
    config = TokenizerConfig(from_file=str(source), check_chars=5_000)
    manifest = tok.run_tokenizer(config, tiny_run / "04_split", tmp_path / "adopted")
    published = tmp_path / "adopted" / "tokenizer.json"
    assert published.read_bytes() == source.read_bytes()
    identity = manifest.extra["tokenizer"]
    assert identity["adopted_from"] == {"path": str(source), "sha256": sha256_file(source)} and identity["eos_id"] == 0
    trained_on = read_manifest(tiny_run / "05_tokenizer").extra["overall"]["chars"]
    checked = manifest.extra["overall"]["chars"]
    assert 0 < identity["round_trip_documents"] and checked < min(trained_on, 2 * 5_000)  # the check sample, not the training one

    again = tok.run_tokenizer(config, tiny_run / "04_split", tmp_path / "adopted")
    assert again.cache_key == manifest.cache_key  # published: a no-op
    other = build_tokenizer(TEXTS, TokenizerConfig(vocab_size=320, min_frequency=1))
    other.save(str(source))
    changed = tok.run_tokenizer(config, tiny_run / "04_split", tmp_path / "adopted")
    assert changed.cache_key != manifest.cache_key
    assert read_manifest(tmp_path / "adopted").extra["tokenizer"]["sha256"] == sha256_file(source)


def test_an_adopted_tokenizer_without_the_end_of_document_token_fails_naming_the_file(tiny_run, tmp_path):
    import pytest
    from tokenizers import Tokenizer, models, pre_tokenizers

    bare = Tokenizer(models.BPE())
    bare.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    path = tmp_path / "bare.json"
    bare.save(str(path))
    from tasks.corpus.tokenizer import run_tokenizer

    with pytest.raises(ValueError, match=rf"{path}: tokenizer.from_file has no <\|endoftext\|> token"):
        run_tokenizer(TokenizerConfig(from_file=str(path)), tiny_run / "04_split", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_relative_adopted_tokenizer_resolves_against_the_config_directory(tmp_path):
    from flows.config import load_config

    config_file = tmp_path / "cfg" / "pipeline.toml"
    config_file.parent.mkdir()
    config_file.write_text('[run]\nsources = []\n\n[tokenizer]\nfrom_file = "base/tokenizer.json"\n', encoding="utf-8")
    assert load_config(config_file).tokenizer.from_file == str((tmp_path / "cfg" / "base" / "tokenizer.json").resolve())

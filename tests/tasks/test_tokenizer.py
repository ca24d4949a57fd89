from tasks.tokenizer import BYTE_TOKENS, EOS_TOKEN, TokenizerConfig, build_tokenizer, load_tokenizer, round_trip_failures, vocab_size_of

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



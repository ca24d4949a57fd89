import json
import random
from collections import Counter

import pytest

from manifests import sample_generator as gen

COMMITTED = gen.DEFAULT_OUT


@pytest.fixture(scope="module")
def committed_records():
    return gen.read_jsonl(COMMITTED)


def test_regeneration_is_byte_identical_to_committed_file(tmp_path):
    out = tmp_path / "generated.jsonl"
    random.seed(987)                      # the generator must not read the global RNG
    gen.main(["--out", str(out)])
    assert out.read_bytes() == COMMITTED.read_bytes()


def test_another_seed_gives_another_file(tmp_path):
    out = tmp_path / "generated.jsonl"
    gen.main(["--out", str(out), "--seed", "1235"])
    assert out.read_bytes() != COMMITTED.read_bytes()


def test_label_counts(committed_records):
    pool = gen.read_jsonl(gen.DEFAULT_POOL)
    counts = Counter(r["meta"]["label"] for r in committed_records)
    assert counts == {"clean": len(pool), "navigation": 40, "spam": 40,
                      "repeated_line": 40, "short": 40, "exact_copy": 40,
                      "near_copy": 60}
    near_rates = Counter(r["meta"]["q"] for r in committed_records
                         if r["meta"]["label"] == "near_copy")
    assert near_rates == {q: 10 for q in gen.NEAR_COPY_RATES}


def test_urls_are_unique_and_clean_docs_are_the_pool(committed_records):
    urls = [r["url"] for r in committed_records]
    assert len(urls) == len(set(urls))
    pool = gen.read_jsonl(gen.DEFAULT_POOL)
    clean = [r for r in committed_records if r["meta"]["label"] == "clean"]
    assert [(r["text"], r["url"]) for r in clean] == [(d["text"], d["url"]) for d in pool]


def test_copies_point_at_distinct_clean_originals(committed_records):
    clean_by_url = {r["url"]: r["text"] for r in committed_records
                    if r["meta"]["label"] == "clean"}
    copies = [r for r in committed_records
              if r["meta"]["label"] in ("exact_copy", "near_copy")]
    sources = [r["meta"]["source_id"] for r in copies]
    assert len(sources) == len(set(sources))
    for record in copies:
        assert record["meta"]["source_id"] in clean_by_url
        if record["meta"]["label"] == "exact_copy":
            assert record["text"] == clean_by_url[record["meta"]["source_id"]]
            assert record["meta"]["true_jaccard"] == 1.0


def test_near_copy_true_jaccard_recomputes_exactly(committed_records):
    clean_by_url = {r["url"]: r["text"] for r in committed_records
                    if r["meta"]["label"] == "clean"}
    for record in committed_records:
        if record["meta"]["label"] != "near_copy":
            continue
        original = clean_by_url[record["meta"]["source_id"]]
        a, b = gen.shingles(record["text"]), gen.shingles(original)
        assert record["meta"]["true_jaccard"] == len(a & b) / len(a | b)
    mean_by_rate = {}
    for q in gen.NEAR_COPY_RATES:
        values = [r["meta"]["true_jaccard"] for r in committed_records
                  if r["meta"]["q"] == q]
        mean_by_rate[q] = sum(values) / len(values)
    # more replacement, less overlap
    rates = list(gen.NEAR_COPY_RATES)
    assert all(mean_by_rate[lo] > mean_by_rate[hi] for lo, hi in zip(rates, rates[1:]))


def test_non_copies_carry_null_copy_fields(committed_records):
    for record in committed_records:
        meta = record["meta"]
        assert set(meta) == {"label", "source_id", "q", "true_jaccard"}
        if meta["label"] not in ("exact_copy", "near_copy"):
            assert meta["source_id"] is None and meta["true_jaccard"] is None
            assert meta["q"] is None


def test_shingles_and_jaccard_on_small_strings():
    a = gen.shingles("The quick brown fox jumps over the lazy dog")
    b = gen.shingles("the QUICK brown fox jumps over a lazy dog")
    assert len(a) == 5
    assert gen.jaccard(a, b) == 2 / 8
    assert gen.jaccard(set(), set()) == 1.0


def test_near_copy_keeps_whitespace_and_replaces_at_rate_one():
    rng = random.Random(0)
    text = "alpha beta\ngamma  delta"
    copy = gen.near_copy_text(rng, text, 1.0)
    assert [len(w) > 0 for w in copy.split()] == [True] * 4
    assert copy.count("\n") == 1 and "  " in copy
    assert all(word in gen.REPLACEMENT_WORDS for word in copy.split())
    assert gen.near_copy_text(rng, text, 0.0) == text


def test_junk_kinds_look_like_their_labels(committed_records):
    by_label = {}
    for record in committed_records:
        by_label.setdefault(record["meta"]["label"], []).append(record["text"])
    for text in by_label["repeated_line"]:
        lines = text.splitlines()
        assert len(lines) >= 8 and len(set(lines)) == 1
    for text in by_label["short"]:
        assert 5 <= len(text.split()) <= 25
    for text in by_label["spam"]:
        words = text.split()
        symbols = sum(w.startswith("#") or "..." in w or "!!!" in w or "$" in w
                      for w in words)
        assert symbols / len(words) > 0.2
    for text in by_label["navigation"]:
        assert all(item in gen.MENU_ITEMS
                   for line in text.splitlines()
                   for item in line.replace(" · ", "|").replace(" > ", "|")
                   .replace(" | ", "|").replace("  ", "|").split("|"))


def test_too_small_pool_is_refused():
    pool = [{"text": f"doc {i} " * 20, "url": f"u{i}"} for i in range(10)]
    with pytest.raises(ValueError):
        gen.generate(pool)


def test_generated_file_is_valid_jsonl_with_text():
    with open(COMMITTED, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            assert isinstance(record["text"], str) and record["text"].strip()

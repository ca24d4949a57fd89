"""The batch word n-gram measure (tasks.filters.word_ngrams) gives every document Gopher's per-document numbers."""
from __future__ import annotations

import random
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tasks.filters.text_view import NON_ALPHABETIC_WORD, TextView
from tasks.filters.word_ngrams import WordNgrams, sorted_groups


def reference(text: str, n: int) -> tuple[float, float]:
    """(top, duplicate) n-gram character fractions by Gopher's wording, one document, plain Python."""
    words = text.split()
    windows = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if len(windows) < 2:
        return 0.0, 0.0
    gram, count = Counter(windows).most_common(1)[0]  # ties: the first seen
    top = (sum(map(len, gram)) + n - 1) * count / len(text) if count >= 2 else 0.0
    seen, covered = set(), set()
    for i, window in enumerate(windows):
        if window in seen:
            covered.update(range(i, i + n))
        seen.add(window)
    return top, float(sum(len(words[i]) for i in covered)) / len(text)


def random_doc(rng: random.Random) -> str:
    vocabulary = ["a", "bb", "ccc", "the", "of", "and", "éé", "日本", "x1", "--"]
    spaces = [" ", "  ", "\n", "\t", "\u3000", "\x1c", "\xa0 "]
    words = [rng.choice(vocabulary[:rng.randint(2, len(vocabulary))]) for _ in range(rng.randint(0, 60))]
    if words and rng.random() < 0.5:  # a repeated block, the shape the n-gram rules catch
        at = rng.randrange(len(words))
        words[at:at] = words[at:at + rng.randint(3, 12)] * rng.randint(1, 3)
    text = "".join(word + rng.choice(spaces) for word in words)
    return rng.choice(["", " ", "\n"]) + text if rng.random() < 0.3 else text.rstrip()


def test_batch_gives_each_document_its_own_numbers():
    rng = random.Random(7)
    texts = [random_doc(rng) for _ in range(300)] + ["", "   ", "solo"]
    batch = WordNgrams(texts)
    for n in range(2, 11):
        for i, text in enumerate(texts):
            result = batch.repetition(i, n)
            expected = reference(text, n) if text.strip() else (0.0, 0.0)
            assert (result.top_fraction, result.duplicate_fraction) == expected, (i, n, text)
    assert [batch.word_count(i) for i in range(len(texts))] == [len(t.split()) for t in texts]
    assert [batch.word_chars(i) for i in range(len(texts))] == [sum(map(len, t.split())) for t in texts]


def test_words_without_letter_match_the_regex_definition():
    """The batch's byte count (ASCII words) and regex (the rest) give NON_ALPHABETIC_WORD's count, on a slice too."""
    rng = random.Random(11)
    tokens = ["abc", "12", "--", "x1", "_", "é", "12€", "²", "—", "日本", "٣", "Ⅻ", "a_b", "...", "“”", "ok."]
    texts = ["pad"] + ["  ".join(rng.choice(tokens) for _ in range(rng.randint(0, 40))) for _ in range(200)] + ["", " \u3000 "]
    batch = WordNgrams(pa.array(texts).slice(1))
    assert batch.without_letter.tolist() == [len(NON_ALPHABETIC_WORD.findall(text)) for text in texts[1:]]


def test_no_window_crosses_documents():
    """The same words end one document and start the next: alone, neither repeats anything."""
    texts = ["x y z a b", "a b c d e", "a b q r s"]
    batch = WordNgrams(texts)
    assert [batch.repetition(0, 2).top_fraction, batch.repetition(1, 2).top_fraction] == [0.0, 0.0]
    assert batch.repetition(0, 2).duplicate_fraction == 0.0
    assert TextView(texts[1]).word_ngrams(2).top_fraction == 0.0


def test_both_orderings_of_the_grouping_sort_agree():
    """The packed one-sort path and the two-key fallback (keys too wide to pack) give the same order."""
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 50, 1000).astype(np.uint64)
    positions = rng.permutation(1000).astype(np.int64)
    packed = sorted_groups(keys, positions, 6, 10)
    wide = sorted_groups(keys, positions, 60, 10)
    assert np.array_equal(packed[0], wide[0]) and np.array_equal(packed[1].astype(np.uint64), wide[1].astype(np.uint64))


@pytest.mark.parametrize("start", range(0, sys.maxunicode + 1, 0x40000))
def test_arrow_whitespace_is_str_split_whitespace(start):
    """The batch splits with Arrow's utf8_split_whitespace; every code point must split as str.split splits it."""
    points = [c for c in range(start, min(start + 0x40000, sys.maxunicode + 1)) if not 0xD800 <= c <= 0xDFFF]
    pieces = pc.list_value_length(pc.utf8_split_whitespace(pa.array(["a" + chr(c) + "b" for c in points]))).to_numpy()
    assert [hex(c) for c, k in zip(points, pieces) if (k == 2) != chr(c).isspace()] == []


def test_a_view_of_the_batch_measures_what_a_view_alone_measures():
    """Every rule's statistic, all rules run: the shard's batch path and a lone document's path agree."""
    from tasks.filters.quality import evaluate
    from tasks.filters.quality_config import QualityConfig

    rng = random.Random(13)
    texts = [random_doc(rng) for _ in range(120)]
    texts += ["\n".join(f"The {i} cat and the dog sat... with {i % 3} hats. # tag" for i in range(k)) for k in (3, 30, 80)]
    config = QualityConfig(all_rules=True)
    batch = WordNgrams(texts)
    for i, text in enumerate(texts):
        assert evaluate(text, "en", config, TextView(text, batch, i)).measured == evaluate(text, "en", config).measured, text

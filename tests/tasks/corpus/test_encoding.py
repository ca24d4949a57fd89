import random

import numpy as np
import pyarrow as pa
import pytest

from tasks.corpus.encoding import char_batches, encode_texts, encoded_batches, ids_with_eos, split_long_text
from tasks.corpus.tokenizer import TokenizerConfig, build_tokenizer

WORDS = "the of data token shard page  x1 99 naïve 中文 über ' - ( ) \t".split(" ")


def messy_text(rng: random.Random, n: int) -> str:
    """Words, odd spacing and newline runs (\\n, \\n\\n, \\n + spaces) where a cut could go wrong."""
    parts = []
    for _ in range(n):
        parts.append(rng.choice(WORDS))
        parts.append(rng.choice([" ", " ", "  ", "\n", "\n\n", "\n  ", " \n", "\t\n", ""]))
    return "".join(parts)


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    return build_tokenizer([messy_text(rng, 400) for _ in range(50)], TokenizerConfig(vocab_size=400, min_frequency=1))


def test_long_text_is_cut_only_after_a_newline_that_text_follows():
    text = "a" * 10 + "\n  b" + "c" * 10 + "\n\nd" + "e" * 10 + " \nf" + "g" * 10 + "\nh"
    pieces = split_long_text(text, size=8)
    assert "".join(pieces) == text
    assert pieces == ["a" * 10 + "\n  b" + "c" * 10 + "\n\nd" + "e" * 10 + " \nf" + "g" * 10 + "\n", "h"]
    assert split_long_text("short", size=8) == ["short"]
    assert split_long_text("x" * 50, size=8) == ["x" * 50]  # no newline: nothing to cut at


def test_cut_documents_encode_to_exactly_the_whole_document_ids(tokenizer):
    rng = random.Random(1)
    texts = [messy_text(rng, rng.randint(0, 3000)) for _ in range(30)] + ["", "\n", "\n\n x"]
    whole = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    assert sum(len(split_long_text(t, 200)) > 1 for t in texts) > 10  # the cutting path is exercised
    assert encode_texts(tokenizer, texts, piece_chars=200) == whole


def test_char_batches_keep_order_and_bound_the_characters():
    tables = [pa.table({"id": [f"{t}-{i}" for i in range(n)], "text": ["x" * (10 * (i + 1)) for i in range(n)]})
              for t, n in enumerate([5, 0, 7, 1])]
    batches = list(char_batches(tables, budget=60))
    assert [i for b in batches for i in b.column("id").to_pylist()] == [i for t in tables for i in t.column("id").to_pylist()]
    for batch in batches:
        lengths = [len(x) for x in batch.column("text").to_pylist()]
        assert batch.num_rows == 1 or sum(lengths[:-1]) < 60  # a batch closes once it reaches the budget


def test_encoded_batches_pair_each_row_with_its_ids(tokenizer):
    rng = random.Random(2)
    tables = [pa.table({"text": [messy_text(rng, 50) for _ in range(n)]}) for n in (3, 9, 4)]
    got = [(text, ids) for batch, ids_list in encoded_batches(tokenizer, tables) for text, ids in zip(batch.column("text").to_pylist(), ids_list)]
    assert [t for t, _ in got] == [t for table in tables for t in table.column("text").to_pylist()]
    assert all(ids == tokenizer.encode(t, add_special_tokens=False).ids for t, ids in got)


def test_ids_with_eos_lays_documents_end_to_end():
    flat, lengths = ids_with_eos([[5, 6], [], [7]], eos_id=0, dtype=np.dtype("<u2"))
    assert flat.tolist() == [5, 6, 0, 0, 7, 0]
    assert lengths.tolist() == [3, 1, 2]
    assert flat.dtype == np.dtype("<u2")

"""The held-out side is tokenised and planned per split shard: the host exchanges totals, and the files are the one-table bytes."""
from __future__ import annotations

import random

import pyarrow as pa

from manifests.atomic import atomic_write_parquet
from manifests.corpus import source_of_id
from tasks.corpus.heldout_side import VALIDATION_DOCUMENTS_SCHEMA, HeldOutSide
from tasks.corpus.split import SplitConfig, iter_split_docs, run_split
from tasks.corpus.tokenizer import EOS_TOKEN, TOKENIZER_FILE, load_tokenizer
from tasks.runner.host_traffic import count_host_traffic

WORDS = ["river", "stone", "light", "table", "window", "garden", "paper", "music", "cloud", "bread"]


def split_of(tmp_path, upstream, documents: int, shards: int, name: str):
    rng = random.Random(documents)
    texts = {f"src{i % 3}-{rng.getrandbits(48):012x}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
             for i in range(documents)}
    run_split(SplitConfig(validation_fraction=0.3), upstream(texts, shards, name), tmp_path / f"{name}-split", workers=1)
    return tmp_path / f"{name}-split"


def test_documents_file_and_sums_are_those_of_one_table(tmp_path, upstream, tiny_run):
    split = split_of(tmp_path, upstream, 600, 5, "bytes")
    tokenizer_path = tiny_run / "05_tokenizer" / TOKENIZER_FILE
    tokenizer = load_tokenizer(tokenizer_path)
    held_out = pa.concat_tables(iter_split_docs(split, "validation", ["id", "lang", "text"]))
    ids = held_out.column("id").to_pylist()
    lengths = [len(tokenizer.encode(text, add_special_tokens=False).ids) + 1 for text in held_out.column("text").to_pylist()]  # + EOS
    reference = pa.table({"doc_id": ids, "source": [source_of_id(i) for i in ids], "lang": [lang or "" for lang in held_out.column("lang").to_pylist()],
                          "tokens": lengths}, schema=VALIDATION_DOCUMENTS_SCHEMA)
    atomic_write_parquet(tmp_path / "reference.parquet", reference)
    (tmp_path / "work").mkdir()
    side = HeldOutSide(split, tokenizer_path, tmp_path / "work", workers=1)
    try:
        side.write_documents(tmp_path / "work" / "documents.parquet")
        assert (tmp_path / "work" / "documents.parquet").read_bytes() == (tmp_path / "reference.parquet").read_bytes()
        assert side.documents == len(ids) > 100 and side.tokens == sum(lengths) == side.tokens_path.stat().st_size // 2
        assert side.by_source == {s: {"documents": sum(source_of_id(i) == s for i in ids),
                                      "tokens": sum(n for i, n in zip(ids, lengths) if source_of_id(i) == s)} for s in ("src0", "src1", "src2")}
        assert tokenizer.token_to_id(EOS_TOKEN) is not None
    finally:
        side.close()
    assert not side.spill_dir.exists() and not side.tokens_path.exists()


def bytes_per_shard(tmp_path, upstream, tiny_run, documents: int, shards: int, name: str) -> float:
    split = split_of(tmp_path, upstream, documents, shards, name)
    (tmp_path / f"{name}-work").mkdir()
    with count_host_traffic() as traffic:
        side = HeldOutSide(split, tiny_run / "05_tokenizer" / TOKENIZER_FILE, tmp_path / f"{name}-work", workers=1)
    side.close()
    return traffic.total() / shards


def test_the_host_exchanges_no_per_document_value(tmp_path, upstream, tiny_run):
    """8x the held-out documents in shards 8x larger: the bytes the host sends and receives per shard stay flat
    (the one-table version received every held-out id and count: ~60 bytes a document)."""
    small = bytes_per_shard(tmp_path, upstream, tiny_run, 200, 4, "small")
    large = bytes_per_shard(tmp_path, upstream, tiny_run, 1600, 4, "large")
    assert large <= 1.1 * small, (small, large)


def test_each_split_shard_is_read_once_and_the_vocabulary_built_once(tmp_path, upstream, tiny_run, monkeypatch):
    """One Parquet read per split shard (the documents and their languages together) and one vocabulary dictionary per
    worker and tokenizer, whatever the shard count (each shard was read a second time for its languages, and each shard
    task built the tokenizer's whole id dictionary again)."""
    import pyarrow.parquet as pq

    import tasks.corpus.mixture as mixture
    import tasks.corpus.split as split_module

    split = split_of(tmp_path, upstream, 300, 4, "reads")
    reads, vocabularies = [], []
    real_read, real_vocab_size = pq.read_table, mixture.vocab_size_of
    # pyarrow's own read_table: every Parquet read of this process is counted, the split shards' are kept below
    monkeypatch.setattr(split_module.pq, "read_table", lambda path, *a, **k: reads.append(path) or real_read(path, *a, **k))
    monkeypatch.setattr(mixture, "vocab_size_of", lambda tokenizer: vocabularies.append(1) or real_vocab_size(tokenizer))
    mixture.tokenizer_layout.cache_clear()
    (tmp_path / "work").mkdir()
    side = HeldOutSide(split, tiny_run / "05_tokenizer" / TOKENIZER_FILE, tmp_path / "work", workers=1)
    side.close()
    shard_reads = [str(path) for path in reads if str(path).startswith(str(split / "data"))]
    assert len(shard_reads) == len(set(shard_reads)) == 4 and len(vocabularies) == 1


def test_the_side_forces_none_of_its_intermediate_files_to_disk(tmp_path, upstream, tiny_run, monkeypatch):
    """Pieces, plan parts and the joined token cache are removed before the stage publishes: atomic, but no fsync (two a
    file, ~10 ms each here); validation_documents.parquet, which the stage publishes, is still forced to disk."""
    import os

    split = split_of(tmp_path, upstream, 200, 3, "sync")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    (tmp_path / "work").mkdir()
    side = HeldOutSide(split, tiny_run / "05_tokenizer" / TOKENIZER_FILE, tmp_path / "work", workers=1)
    try:
        assert side.documents > 0 and synced == []
        side.write_documents(tmp_path / "work" / "documents.parquet")
        assert synced
    finally:
        side.close()

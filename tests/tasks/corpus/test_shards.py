from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tasks.corpus.occurrence_stream as occurrence_stream

from manifests.corpus import read_corpus_manifest
from manifests.stage_manifest import read_manifest
from tasks.corpus.encoding import token_dtype
from tasks.corpus.occurrence_stream import cut_shards, lay_out_stream, occurrence_ranks, stream_blocks, write_blocks, write_shard
from tasks.corpus.shards import ShardsConfig, run_shards, trace_token
from tasks.corpus.occurrence_stream import OCCURRENCE_SCHEMA
from tasks.corpus.split import iter_split_docs
from tasks.dedup.spill_reader import SpillFiles
from tasks.dedup.table_slices import read_table_slices
from tasks.corpus.tokenizer import load_tokenizer, vocab_size_of


def flat_vocab_tokenizer(size):
    from tokenizers import Tokenizer, models

    return Tokenizer(models.BPE(vocab={f"t{i}": i for i in range(size)}, merges=[]))


def test_dtype_boundary_at_65536_ids():
    tokenizer = flat_vocab_tokenizer(65_536)
    assert vocab_size_of(tokenizer) == 65_536 and token_dtype(vocab_size_of(tokenizer)) == np.dtype("<u2")
    tokenizer.add_special_tokens(["<|one_more|>"])
    assert vocab_size_of(tokenizer) == 65_537 and token_dtype(vocab_size_of(tokenizer)) == np.dtype("<u4")


def write_plan(path, docs, repeats, parts=1):
    """A mixture-like plan (id, offset, tokens, repeats) in `parts` parts for (id, tokens) documents, and their token
    file: document i's tokens are 0..n-1."""
    path.mkdir(parents=True, exist_ok=True)
    lengths = np.array([n for _, n in docs], dtype=np.int64)
    plan = pa.table({"id": [d for d, _ in docs], "offset": np.cumsum(lengths) - lengths, "tokens": lengths, "repeats": np.asarray(repeats, np.int64)})
    bounds = np.linspace(0, len(docs), parts + 1).astype(int).tolist()
    paths = [path / f"plan-{i:03d}.parquet" for i in range(parts)]
    for part, start, stop in zip(paths, bounds, bounds[1:]):
        pq.write_table(plan.slice(start, stop - start), part)
    np.concatenate([np.arange(n, dtype="<u2") for _, n in docs] or [np.zeros(0, "<u2")]).tofile(path / "tokens.bin")
    return paths, path / "tokens.bin"


def streamed(tmp_path, docs, repeats, seed=0, workers=1, parts=1):
    """(id, repeat) of the stream's occurrences, in stream order, as the sort tasks wrote them."""
    plan, _ = write_plan(tmp_path, docs, repeats, parts)
    blocks = stream_blocks(plan, seed, tmp_path / "spill", workers)
    spill = SpillFiles()
    rows = read_table_slices(spill, [b.slice for b in blocks], OCCURRENCE_SCHEMA)
    spill.close()
    return list(zip(rows.column("id").to_pylist(), rows.column("repeat").to_pylist()))


def test_occurrences_are_epoch_major_and_seeded(tmp_path):
    docs = {"a": 2, "b": 1, "c": 3, "z": 0}
    first = streamed(tmp_path / "one", [(d, 4) for d in docs], list(docs.values()))
    assert Counter(d for d, _ in first) == {"a": 2, "b": 1, "c": 3}
    assert [k for _, k in first] == sorted(k for _, k in first)
    assert sorted(first) == [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("c", 1), ("c", 2)]
    shuffled = {"c": 3, "z": 0, "b": 1, "a": 2}
    assert first == streamed(tmp_path / "two", [(d, 4) for d in shuffled], list(shuffled.values()))


def test_the_external_sort_gives_the_in_memory_order_across_parts_ranges_and_blocks(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    docs = [(f"d{i:03d}", int(n)) for i, n in enumerate(rng.integers(1, 9, size=300))]
    repeats = rng.integers(0, 4, size=len(docs))
    doc, k, rank = occurrence_ranks([d for d, _ in docs], repeats, seed=7)
    order = np.lexsort((doc, rank, k))
    expected = [(docs[d][0], int(r)) for d, r in zip(doc[order].tolist(), k[order].tolist())]
    monkeypatch.setattr(occurrence_stream, "BLOCK_ROWS", 11)
    assert streamed(tmp_path, docs, repeats, seed=7, parts=8) == expected


def read_stream(run, side):
    corpus = read_corpus_manifest(run)
    root = run / "07_shards"
    pieces = []
    for entry in corpus["shards"][side]:
        tokens = np.fromfile(root / entry["path"], dtype=np.dtype(corpus["dtype"]).newbyteorder("<"))
        assert len(tokens) == entry["tokens"] <= 4096
        for row in pq.read_table(root / entry["index_path"]).to_pylist():
            pieces.append((row, tokens[row["offset"]:row["offset"] + row["length"]]))
    return corpus, pieces


def test_shards_hold_every_document_exactly_its_mixture_repeats_and_decode_back(tiny_run):
    corpus, pieces = read_stream(tiny_run, "train")
    tokenizer = load_tokenizer(tiny_run / "07_shards" / "tokenizer.json")
    texts = {i: t for table in iter_split_docs(tiny_run / "04_split", "train", ["id", "text"]) for i, t in zip(table.column("id").to_pylist(), table.column("text").to_pylist())}
    plan = [row for part in sorted((tiny_run / "06_mixture" / "plan").glob("*.parquet")) for row in pq.read_table(part).to_pylist()]
    documents: dict = {}
    for row, tokens in pieces:  # reassemble documents split across shard boundaries
        documents.setdefault((row["doc_id"], row["repeat"]), []).append((row["doc_start"], tokens))
    assert Counter(d for d, _ in documents) == {p["id"]: p["repeats"] for p in plan if p["repeats"]}
    for (doc_id, _), parts in documents.items():
        ids = np.concatenate([t for _, t in sorted(parts, key=lambda p: p[0])])
        assert ids[-1] == corpus["eos_id"]
        assert tokenizer.decode(ids[:-1].tolist(), skip_special_tokens=False) == texts[doc_id]
    assert sum(len(t) for _, t in pieces) == corpus["train_tokens"] == corpus["mixture"]["tokens_contributed"]


def test_validation_shards_hold_only_held_out_documents_once(tiny_run):
    corpus, pieces = read_stream(tiny_run, "validation")
    held_out = {i for table in iter_split_docs(tiny_run / "04_split", "validation", ["id"]) for i in table.column("id").to_pylist()}
    assert {row["doc_id"] for row, _ in pieces} == held_out
    assert Counter((row["doc_id"], row["doc_start"]) for row, _ in pieces).most_common(1)[0][1] == 1
    train_ids = {row["doc_id"] for row, _ in read_stream(tiny_run, "train")[1]}
    assert not train_ids & held_out


def test_corpus_manifest_lists_digests_and_rerun_is_a_no_op(tiny_run):
    manifest = read_manifest(tiny_run / "07_shards")  # verifies every file's sha256
    corpus = read_corpus_manifest(tiny_run)
    assert manifest.extra["corpus_digest"] == corpus["digest"]
    assert {o.path for o in manifest.outputs} >= {e["path"] for side in corpus["shards"].values() for e in side}
    again = run_shards(ShardsConfig(tokens_per_shard=4096), tiny_run / "04_split", tiny_run / "05_tokenizer", tiny_run / "06_mixture", tiny_run / "07_shards")
    assert again.digest == manifest.digest and again.wall_time_s == manifest.wall_time_s


def test_trace_names_document_and_position_across_a_shard_boundary(tiny_run):
    root = tiny_run / "07_shards"
    index = pq.read_table(root / "tokens" / "train-00001.idx.parquet").to_pylist()
    continued = index[0]  # shard 1 opens with the tail of a document that began in shard 0
    assert continued["doc_start"] > 0
    found = trace_token(tiny_run, 1, continued["offset"] + 2, "train", window=4)
    assert found["doc_id"] == continued["doc_id"]
    assert found["position_in_document"] == continued["doc_start"] + 2
    assert found["window_token"] and found["shard_path"] == "tokens/train-00001.bin"
    with pytest.raises(IndexError, match="offset"):
        trace_token(tiny_run, 0, 10 ** 9)
    with pytest.raises(IndexError, match="no shard 99"):
        trace_token(tiny_run, 99, 0)


def explicit_stream(tmp_path, docs, order, tokens_per_shard):
    """Shards cut from occurrences in a given order ((document index, repeat) pairs), as the shard tasks write them."""
    _, tokens = write_plan(tmp_path, docs, [0] * len(docs))
    lengths = np.array([n for _, n in docs], dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    occurrences = pa.table({"id": [docs[d][0] for d, _ in order], "start": [int(starts[d]) for d, _ in order],
                            "length": [int(lengths[d]) for d, _ in order], "repeat": [k for _, k in order],
                            "rank": np.zeros(len(order), np.uint64), "row": [d for d, _ in order]}, schema=OCCURRENCE_SCHEMA)
    (tmp_path / "out").mkdir()
    layouts = cut_shards(write_blocks(tmp_path / "blocks.npy", occurrences), tokens_per_shard, "train")
    return [write_shard(layout, str(tokens), "<u2", str(tmp_path / "out")) for layout in layouts]


def test_stream_splits_documents_at_the_shard_bound_and_indexes_each_piece(tmp_path, monkeypatch):
    monkeypatch.setattr(occurrence_stream, "BLOCK_ROWS", 2)  # the middle document's pieces come from two blocks
    shards = explicit_stream(tmp_path, [("a", 5), ("b", 7), ("c", 4)], [(0, 0), (1, 0), (2, 0)], 6)  # 16 tokens, shards of 6
    assert [s["tokens"] for s in shards] == [6, 6, 4]
    rows = [r for s in shards for r in pq.read_table(tmp_path / "out" / f"{s['name']}.idx.parquet").to_pylist()]
    assert [(r["doc_id"], r["offset"], r["length"], r["doc_start"]) for r in rows] == [
        ("a", 0, 5, 0), ("b", 5, 1, 0), ("b", 0, 6, 1), ("c", 0, 4, 0)]
    stream = np.concatenate([np.fromfile(tmp_path / "out" / f"{s['name']}.bin", dtype="<u2") for s in shards])
    assert stream.tolist() == list(range(5)) + list(range(7)) + list(range(4))


def test_document_longer_than_a_shard_spans_several(tmp_path):
    shards = explicit_stream(tmp_path, [("long", 13)], [(0, 0), (0, 1)], 5)
    assert [s["tokens"] for s in shards] == [5, 5, 5, 5, 5, 1]
    last = pq.read_table(tmp_path / "out" / "train-00005.idx.parquet").to_pylist()
    assert last == [{"doc_id": "long", "offset": 0, "length": 1, "doc_start": 12, "repeat": 1}]


def test_shards_are_written_by_one_task_each_with_the_bytes_of_one_pass(tmp_path, monkeypatch):
    """Random lengths and repeats cut into 7-token shards: the shard tasks' files equal one stream cut sequentially."""
    rng = np.random.default_rng(5)
    docs = [(f"d{i}", int(n)) for i, n in enumerate(rng.integers(1, 20, size=30))]
    repeats = rng.integers(0, 3, size=len(docs))
    monkeypatch.setattr(occurrence_stream, "BLOCK_ROWS", 4)
    plan, tokens = write_plan(tmp_path, docs, repeats)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = lay_out_stream(plan, tokens, np.dtype("<u2"), 7, 3, tmp_path / "one", "train", tmp_path / "spill-one", workers=1)
    two = lay_out_stream(plan, tokens, np.dtype("<u2"), 7, 3, tmp_path / "two", "train", tmp_path / "spill-two", workers=2)
    assert one == two and len(one) > 10  # same names, token counts and file digests (the workers read the default blocks)
    doc, k, rank = occurrence_ranks([d for d, _ in docs], repeats, seed=3)
    order = np.lexsort((doc, rank, k))
    stream = np.concatenate([np.arange(docs[d][1], dtype="<u2") for d in doc[order].tolist()])
    written = np.concatenate([np.fromfile(tmp_path / "two" / f"{s['name']}.bin", dtype="<u2") for s in two])
    assert written.tolist() == stream.tolist() and all(s["tokens"] == 7 for s in two[:-1])
    assert not (tmp_path / "spill-one").exists() and not (tmp_path / "spill-two").exists()


def host_peak_bytes(tmp_path, documents: int) -> int:
    """Peak Python-heap bytes of the planning process while it lays out `documents` 10-token documents into 20 shards
    (the tasks run in workers)."""
    import tracemalloc

    plan, tokens = write_plan(tmp_path, [(f"doc-{i:07d}", 10) for i in range(documents)], [1] * documents, parts=documents // 1_000)
    (tmp_path / "out").mkdir()
    tracemalloc.start()
    try:
        shards = lay_out_stream(plan, tokens, np.dtype("<u2"), documents // 2, 0, tmp_path / "out", "train", tmp_path / "spill", workers=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(s["tokens"] for s in shards) == 10 * documents
    return peak


def test_the_planning_process_holds_no_per_document_data(tmp_path):
    """8x the documents in 8x the plan parts, as many shards: the host's peak grows by a few records per part, not by the documents
    (holding the ids and ranks, as the in-memory layout did, is ~150 bytes a document; a shard costs the host ~3 KB)."""
    host_peak_bytes(tmp_path / "warm", 2_000)  # imports and the worker pool, once
    small, large = host_peak_bytes(tmp_path / "small", 4_000), host_peak_bytes(tmp_path / "large", 32_000)
    assert (large - small) / 28_000 < 16, (small, large)


def test_a_token_file_shorter_than_its_plan_fails_naming_the_file_and_publishes_no_shard(tmp_path, monkeypatch):
    """The shard task copies pieces out of the mapped token file: a file cut short (a truncated copy) is refused, not padded."""
    real_write_plan = write_plan

    def truncated(path, docs, repeats, parts=1):
        paths, tokens = real_write_plan(path, docs, repeats, parts)
        np.fromfile(tokens, dtype="<u2")[:-3].tofile(tokens)
        return paths, tokens

    monkeypatch.setitem(globals(), "write_plan", truncated)
    with pytest.raises(ValueError, match=r"tokens\.bin: 13 tokens, shard train-00000 reads up to 16"):
        explicit_stream(tmp_path, [("a", 5), ("b", 7), ("c", 4)], [(0, 0), (1, 0), (2, 0)], 100)
    assert not list((tmp_path / "out").iterdir())

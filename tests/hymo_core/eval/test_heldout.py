"""Held-out loss per source and language: groups from the split's held-out side only, exact bytes, sums that add up."""
from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from hymo_core.eval.heldout import ALL, HeldOutSet, evaluate_heldout
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.data import CorpusReader, ValidationLoader
from hymo_core.train.trainer import evaluate
from tasks.corpus.split import VALIDATION, iter_split_docs

CPU = torch.device("cpu")


def tiny_model(vocab_size: int) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16))


def doc_ids(reader: CorpusReader, split: str) -> set[str]:
    return {d for e in reader.shard_entries(split) for d in pq.read_table(reader.root / e["index_path"]).column("doc_id").to_pylist()}


def test_groups_come_from_held_out_documents_only(tiny_run):
    reader = CorpusReader(tiny_run / "07_shards")
    held = HeldOutSet.from_corpus(reader, seq_len=16, batch_size=4, max_batches=2)
    assert held.groups[0] == ALL and {"source:prose", "source:mixed"} <= set(held.groups)
    assert any(g.startswith("lang:") for g in held.groups)
    assert not doc_ids(reader, "train") & doc_ids(reader, VALIDATION)  # no held-out document is trained on
    table = pq.read_table(reader.root / reader.manifest["validation"]["documents_table"]["path"]).to_pylist()
    assert {r["doc_id"] for r in table} == doc_ids(reader, VALIDATION)
    assert {f"source:{r['source']}" for r in table} <= set(held.groups)


def test_bytes_per_token_are_the_documents_utf8_bytes(tiny_run):
    reader = CorpusReader(tiny_run / "07_shards")
    held = HeldOutSet.from_corpus(reader, seq_len=16, batch_size=4)
    texts = {row["id"]: row["text"] for t in iter_split_docs(tiny_run / "04_split", VALIDATION, ["id", "text"]) for row in t.to_pylist()}
    entry = reader.shard_entries(VALIDATION)[0]
    index = pq.read_table(reader.root / entry["index_path"]).to_pylist()
    tokens = np.asarray(reader.shard(VALIDATION, 0))
    for row in index[:5]:
        ids = tokens[row["offset"]:row["offset"] + row["length"]]
        assert int(held.token_bytes_V[ids].sum()) == len(texts[row["doc_id"]].encode("utf-8"))  # EOS counts 0


def test_group_sums_add_up_and_small_groups_get_windows(tiny_run):
    reader = CorpusReader(tiny_run / "07_shards")
    held = HeldOutSet.from_corpus(reader, seq_len=16, batch_size=4, max_batches=1)  # 4 windows for all the groups
    assert held.selection == "balanced" and len(held) == 4
    result = evaluate_heldout(tiny_model(reader.vocab_size), held, CPU)
    groups = result.groups
    assert {"source:prose", "source:mixed"} <= set(groups)  # each source led a window within the budget
    for prefix in ("source:", "lang:"):
        members = [g for name, g in groups.items() if name.startswith(prefix)]
        assert sum(g["tokens"] for g in members) == groups[ALL]["tokens"] == 4 * 16
        assert sum(g["bytes"] for g in members) == groups[ALL]["bytes"]
        assert sum(g["loss"] * g["tokens"] for g in members) == pytest.approx(groups[ALL]["loss"] * groups[ALL]["tokens"])
    bpb = groups[ALL]["loss"] * groups[ALL]["tokens"] / (math.log(2) * groups[ALL]["bytes"])
    assert groups[ALL]["bpb"] == pytest.approx(bpb)
    record = result.to_record()
    assert record["val_loss"] == groups[ALL]["loss"] and set(record["groups"]) == set(groups) - {ALL}


def test_prefix_selection_is_the_validation_loaders(tiny_run, tiny_corpus):
    reader = CorpusReader(tiny_run / "07_shards")
    model = tiny_model(reader.vocab_size)
    prefix = HeldOutSet.from_corpus(reader, seq_len=16, batch_size=4, max_batches=2, balanced=False)
    loader = ValidationLoader(reader, 16, 4, max_batches=2)
    assert prefix.windows.tolist() == loader.windows[:8].tolist()
    result = evaluate_heldout(model, prefix, CPU)
    assert result.loss == pytest.approx(evaluate(model, loader, CPU), rel=1e-6) and len(result.window_losses) == 8
    plain = HeldOutSet.from_corpus(CorpusReader(tiny_corpus), seq_len=16, batch_size=4, max_batches=2)  # no index, no tokenizer
    assert plain.groups == [ALL]
    only = evaluate_heldout(tiny_model(64), plain, CPU)
    assert set(only.groups) == {ALL} and only.groups[ALL]["bpb"] is None

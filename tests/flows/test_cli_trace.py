import json

import pyarrow.parquet as pq

from flows.cli import main


def test_trace_prints_document_and_audit_trail(tiny_run, capsys):
    index = pq.read_table(tiny_run / "07_shards" / "tokens" / "train-00001.idx.parquet").to_pylist()
    row = index[1]
    assert main(["trace", str(tiny_run), "--shard", "1", "--offset", str(row["offset"]), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["doc_id"] == row["doc_id"] and found["position_in_document"] == row["doc_start"]
    assert found["url"].startswith("https://") and found["source"] in ("prose", "mixed")
    assert [s["stage"] for s in found["audit"]["stages"]][:2] == ["ingest", "extract"]
    assert found["audit"]["final"] == "kept"


def test_trace_of_validation_token_shows_held_out_routing(tiny_run, capsys):
    assert main(["trace", str(tiny_run), "--shard", "0", "--offset", "0", "--split", "validation"]) == 0
    out = capsys.readouterr().out
    assert "held_out" in out and "validation shard 0 offset 0" in out


def test_trace_out_of_range_is_an_error_not_a_crash(tiny_run, capsys):
    assert main(["trace", str(tiny_run), "--shard", "0", "--offset", "999999999"]) == 1
    assert "outside" in capsys.readouterr().out


def test_manifest_show_prints_corpus_table(tiny_run, capsys):
    assert main(["manifest", "show", str(tiny_run)]) == 0
    out = capsys.readouterr().out
    assert "corpus" in out and "CC0-1.0" in out and "validation:" in out


def test_trace_step_names_the_documents_that_update_read(tiny_run, tmp_path, capsys):
    """`hymo trace RUN --step N`: the windows are the ones the training loader reads for update N (checked by
    running the loader as the trainer does, past an epoch turn), and every document they touch is listed."""
    import torch  # noqa: F401 (the loader's tensors)

    from hymo_core.train.data import CorpusReader, EndOfEpoch, TokenLoader
    from tasks.corpus.shards import trace_token

    seq_len, micro, accumulation, seed = 32, 4, 2, 3
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f"[train]\nseq_len = {seq_len}\nbatch_size = {micro}\ngradient_accumulation_steps = {accumulation}\nseed = {seed}\n")
    reader = CorpusReader(tiny_run)
    loader = TokenLoader(reader, "train", seq_len, micro, seed)
    step = loader.batches_per_epoch // accumulation + 2  # in the second epoch
    for _ in range(step):
        loader.reserve_update(micro * accumulation)  # as the trainer does before each update
        blocks = []
        for _ in range(accumulation):
            try:
                x, y = loader.next_batch()
            except EndOfEpoch:
                loader.start_next_epoch()
                x, y = loader.next_batch()
            blocks += [row.tolist() + [last] for row, last in zip(x, y[:, -1].tolist())]
    assert main(["trace", str(tiny_run), "--step", str(step), "--config", str(recipe), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["epoch"] == 1 and len(found["windows"]) == micro * accumulation
    shards = reader.open_all("train")
    assert [shards[s][o:o + seq_len + 1].tolist() for s, o in found["windows"]] == blocks  # the very tokens of update N
    listed = {doc["doc_id"]: doc for doc in found["documents"]}
    for shard, offset in found["windows"]:
        for token in (offset, offset + seq_len):  # the first and last token of each window, traced one by one
            assert trace_token(tiny_run, shard, token)["doc_id"] in listed
    assert sum(doc["tokens"] for doc in found["documents"]) == len(found["windows"]) * (seq_len + 1)
    assert all(doc["source"] in ("prose", "mixed") and doc["url"] for doc in found["documents"])
    assert main(["trace", str(tiny_run), "--step", str(step), "--config", str(recipe)]) == 0
    assert f"update {step} (epoch 1)" in capsys.readouterr().out

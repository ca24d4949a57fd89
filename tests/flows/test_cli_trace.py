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

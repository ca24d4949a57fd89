import json
import shutil

import numpy as np
import pytest
import torch

from hymo_core.train.data import CorpusError, CorpusReader, EndOfEpoch, TokenLoader, ValidationLoader, _canonical_digest


def test_reader_accepts_run_dir_and_matches_pipeline_digest(tiny_run):
    from manifests.corpus import corpus_digest, read_corpus_manifest

    corpus = CorpusReader(tiny_run)
    payload = read_corpus_manifest(tiny_run)
    assert corpus.digest == payload["digest"] == corpus_digest(payload) == _canonical_digest(json.loads(corpus.path.read_text()))
    assert corpus.dtype == np.dtype("<u2")


def test_batches_are_shifted_windows_of_the_stream(tiny_run):
    corpus = CorpusReader(tiny_run)
    loader = TokenLoader(corpus, seq_len=32, batch_size=4, seed=0)
    x_BT, y_BT = loader.next_batch()
    assert x_BT.shape == y_BT.shape == (4, 32) and x_BT.dtype == torch.int64
    assert torch.equal(x_BT[:, 1:], y_BT[:, :-1])
    assert int(x_BT.max()) < corpus.vocab_size


def test_resume_from_state_gives_identical_next_batches(tiny_run):
    corpus = CorpusReader(tiny_run)
    loader = TokenLoader(corpus, seq_len=16, batch_size=3, seed=5)
    for _ in range(4):
        loader.next_batch()
    state = torch.load(_save(loader.state_dict()), weights_only=True)  # through a checkpoint file
    expected = [loader.next_batch() for _ in range(5)]
    global_before = torch.random.get_rng_state().clone(), np.random.get_state()[1].copy()
    resumed = TokenLoader(CorpusReader(tiny_run), seq_len=16, batch_size=3, seed=5)
    resumed.load_state_dict(state)
    for want, got in zip(expected, (resumed.next_batch() for _ in range(5))):
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    assert torch.equal(global_before[0], torch.random.get_rng_state()) and np.array_equal(global_before[1], np.random.get_state()[1])


def _save(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_epoch_end_is_explicit_and_next_epoch_reshuffles(tiny_run):
    loader = TokenLoader(CorpusReader(tiny_run), seq_len=64, batch_size=8, seed=0)
    first_epoch = [loader.next_batch()[0] for _ in range(loader.batches_per_epoch)]
    with pytest.raises(EndOfEpoch):
        loader.next_batch()
    loader.start_next_epoch()
    assert loader.state_dict()["epoch"] == 1
    assert not torch.equal(loader.next_batch()[0], first_epoch[0])


def test_state_from_another_corpus_or_seed_is_refused(tiny_run):
    loader = TokenLoader(CorpusReader(tiny_run), seq_len=16, batch_size=2, seed=0)
    state = loader.state_dict()
    with pytest.raises(CorpusError, match="manifest_digest"):
        loader.load_state_dict({**state, "manifest_digest": "0" * 64})
    with pytest.raises(CorpusError, match="seed"):
        TokenLoader(loader.corpus, seq_len=16, batch_size=2, seed=1).load_state_dict(state)


def test_shard_with_wrong_digest_is_refused_naming_its_path(tiny_run, tmp_path):
    copy = tmp_path / "07_shards"
    shutil.copytree(tiny_run / "07_shards", copy)
    victim = copy / "tokens" / "train-00002.bin"
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=str(victim)):
        TokenLoader(CorpusReader(copy), seq_len=16, batch_size=2)


def test_edited_manifest_is_refused(tiny_run, tmp_path):
    copy = tmp_path / "07_shards"
    shutil.copytree(tiny_run / "07_shards", copy)
    payload = json.loads((copy / "corpus.json").read_text())
    payload["shards"]["train"] = payload["shards"]["train"][:1]
    (copy / "corpus.json").write_text(json.dumps(payload))
    with pytest.raises(CorpusError, match="digest"):
        CorpusReader(copy)


def test_validation_loader_is_a_fixed_prefix(tiny_run):
    corpus = CorpusReader(tiny_run)
    val = ValidationLoader(corpus, seq_len=16, batch_size=4, max_batches=3)
    first, second = list(val), list(val)
    assert len(first) == 3 == len(val)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, second))
    stream = np.fromfile(corpus.root / corpus.manifest["shards"]["validation"][0]["path"], dtype="<u2")
    assert first[0][0][0].tolist() == stream[:16].tolist()


def test_loader_module_does_not_pull_in_the_pipeline():
    import subprocess
    import sys

    probe = ("import sys, hymo_core.train.data; "
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('prefect', 'tasks', 'flows', 'manifests', 'pyarrow', 'tokenizers')); "
             "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_data_parallel_ranks_read_disjoint_windows_in_step(tiny_run):
    corpus = CorpusReader(tiny_run)
    single = TokenLoader(corpus, seq_len=16, batch_size=4, seed=2)
    ranks = [TokenLoader(corpus, seq_len=16, batch_size=2, seed=2, rank=r, world_size=2) for r in range(2)]
    for _ in range(3):
        x_single = single.next_batch()[0]
        x_ranks = torch.cat([loader.next_batch()[0] for loader in ranks])
        assert torch.equal(x_single, x_ranks)  # the same global batch, split between the ranks
    assert ranks[0].state_dict()["position"] == ranks[1].state_dict()["position"] == single.state_dict()["position"]
    with pytest.raises(CorpusError, match="world_size"):
        TokenLoader(corpus, seq_len=16, batch_size=2, seed=2, rank=0, world_size=4).load_state_dict(ranks[0].state_dict())

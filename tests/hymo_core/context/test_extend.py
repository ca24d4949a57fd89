"""Context extension (hymo_core/context/): the RoPE change, the long-document data plan, and `hymo extend` end to end."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hymo_core.context.long_documents import LongDocumentLoader, document_spans
from hymo_core.context.needle import needle_batches, needle_positions
from hymo_core.context.position import extended_config
from hymo_core.kernels import rope_tables
from hymo_core.models.configs import ModelConfig
from hymo_core.train.data import CorpusError, CorpusReader, _canonical_digest

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB, SHORT, LONG = 64, 6, 80  # document lengths in tokens


def write_documents(root: Path, seed: int = 0) -> Path:
    """A corpus whose shards pack short documents (SHORT tokens) and a few long ones (LONG), EOS (0) between them."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(16, VOCAB, size=5) for _ in range(6)]

    def document(length: int) -> list[int]:
        out: list[int] = []
        while len(out) < length:
            out += phrases[int(rng.integers(len(phrases)))].tolist()
        return out[:length] + [0]

    (root / "tokens").mkdir(parents=True, exist_ok=True)
    shards = {}
    for split, (short, long) in (("train", (300, 24)), ("validation", (40, 4))):
        lengths = [SHORT] * short + [LONG] * long
        rng.shuffle(lengths)
        tokens = np.asarray([t for n in lengths for t in document(n)], dtype="<u2")
        path = root / "tokens" / f"{split}-00000.bin"
        tokens.tofile(path)
        shards[split] = [{"path": f"tokens/{split}-00000.bin", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "tokens": len(tokens)}]
    manifest = {"dtype": "uint16", "byte_order": "little", "eos_id": 0, "tokenizer": {"vocab_size": VOCAB}, "shards": shards}
    manifest["digest"] = _canonical_digest(manifest)
    (root / "corpus.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


def test_position_plans_change_only_the_rope_table():
    config = ModelConfig(vocab_size=VOCAB, d_model=32, n_heads=2, n_kv_heads=2, max_seq_len=16)
    interpolated = extended_config(config, 64, "interpolation")
    assert (interpolated.max_seq_len, interpolated.rope_position_scale, interpolated.rope_base) == (64, 4.0, config.rope_base)
    cos_new, _ = rope_tables(64, 16, config.rope_base, position_scale=4.0)
    cos_old, _ = rope_tables(16, 16, config.rope_base)
    assert torch.allclose(cos_new[::4], cos_old)  # position 4p of the long window has position p's angles
    rebased = extended_config(config, 64, "base")
    assert rebased.rope_position_scale == 1.0 and rebased.rope_base == pytest.approx(config.rope_base * 4 ** (16 / 14))
    with pytest.raises(ValueError, match="must exceed"):
        extended_config(config, 16, "base")


def test_long_document_windows_skip_packed_short_documents(tmp_path):
    assert document_spans(np.asarray([5, 6, 0, 7, 0, 0, 8]), 0).tolist() == [[0, 2], [3, 1], [5, 0], [6, 1]]
    reader = CorpusReader(write_documents(tmp_path))
    loader = LongDocumentLoader(reader, "train", 32, 4)
    assert loader.counts["long_documents"] == 24 and loader.counts["documents"] == 324
    assert loader.counts["windows"] == 24 * ((LONG - 1) // 32)
    x, y = loader.next_batch()
    assert x.shape == (4, 32) and not (x == 0).any() and not (y == 0).any()  # never across a document boundary
    with pytest.raises(CorpusError, match="inside documents"):
        LongDocumentLoader(reader, "train", LONG + 5, 4)


def test_needles_span_the_window_and_the_control_has_none():
    positions = needle_positions(64, 8, 5)
    assert positions[0] == 0 and positions[-1] == 64 - 16
    batches = needle_batches(np.full((3, 64), 20), VOCAB, positions, 8, 4)
    tail = batches["control"][:, -8:]
    for p in positions:
        assert (batches[p][:, p:p + 8] == tail).all()
    assert (batches["control"][:, :-8] == 20).all()  # the control window holds only filler before its final copy


def test_hymo_extend_continues_a_hybrid_checkpoint_at_four_times_its_window(tmp_path):
    from flows.cli import main
    from hymo_core.checkpoint.load import load_model
    from hymo_core.train.config import TrainConfig
    from hymo_core.train.run import run_training

    corpus = write_documents(tmp_path / "corpus")
    model = ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=32, max_seq_len=16,
                        layer_pattern="GM")  # GDN (no positions) and MLA (its decoupled RoPE key)
    base = run_training(corpus, tmp_path / "base", TrainConfig(batch_size=4, seq_len=16, max_steps=4, warmup_steps=1, log_interval=2,
                                                               eval_batches=2, checkpoint_interval=4, eval_interval=4),
                        model, cloze_path=None, progress=False, log=lambda *a, **k: None)
    out = tmp_path / "extended"
    assert main(["extend", base["checkpoint"], "--seq-len", "64", "--corpus", str(corpus), "--out", str(out),
                 "--position", "interpolation", "--steps", "3", "--trials", "4"]) == 0
    result = json.loads((out / "extend.json").read_text(encoding="utf-8"))
    assert (result["old_window"], result["new_window"], result["rope_position_scale"]) == (16, 64, 4.0)
    assert result["data"]["long_documents"] == 24 and result["data"]["tokens_trained"] == 3 * 1 * 64  # 4 x 16 tokens -> 1 x 64
    needle = result["measurements"]["after"]["needle"]["by_position"]
    assert needle[0]["position"] == 0 and needle[-1]["distance"] == 8 and len(needle) == 8
    assert all(0.0 <= row["accuracy"] <= 1.0 and np.isfinite(row["gain"]) for row in needle)
    before, after = (result["measurements"][s]["short_loss"] for s in ("before", "after"))
    assert result["short_loss_change"] == pytest.approx(after - before)
    extended, payload = load_model(result["checkpoint"])
    assert extended.config.max_seq_len == 64 and extended.config.rope_position_scale == 4.0
    assert extended(torch.ones(1, 64, dtype=torch.long))[0].shape == (1, 64, VOCAB)
    assert main(["extend", base["checkpoint"], "--seq-len", "64", "--corpus", str(corpus), "--out", str(out)]) != 0  # never over a finished one

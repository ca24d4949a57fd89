"""The dense step moves no avoidable bytes around its kernels, counted on the meta device (issue 53, parts 5 and 6).

* No custom op (`hymo::*`) is handed a strided input (each was a copy in its body: SwiGLU's gate/up
  slices of the fused projection, RoPE's q/k slice of the qkv projection), and no `slice_backward`
  zero-fills a gradient to be added to another: the fused projections' gradients are written whole.
* The loss never holds the full logits: at 8 x 2048 tokens and vocabulary 50,304 the peak of live
  storage over forward and backward stays under the size of the full fp32 logits.
* The chunked loss (the output projection fused into cross-entropy + z-loss) equals the loss on the full
  logits in value and in every gradient, with ignored targets, z-loss and muP's output multiplier.
"""

import importlib

import pytest
import torch

from hymo_core import kernels
from hymo_core.models.init import build_on_meta
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.launch_count import LaunchCounter, PeakBytes

DENSE = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=64)


def counted_step(config: ModelConfig, batch: int, seq: int) -> LaunchCounter:
    model = build_on_meta(config, seed=0)
    tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    counter = LaunchCounter()
    with counter, counter.phase("forward"):
        _, loss = model(tokens, tokens)
    with counter, counter.phase("backward"):
        loss.backward()
    return counter


def test_no_strided_inputs_to_custom_ops_and_no_slice_backward():
    counter = counted_step(DENSE, 2, 64)
    assert counter.noncontiguous_inputs() == {}
    ops = dict(counter.top(100))
    assert "aten.slice_backward" not in ops
    assert ops["hymo.rope.default"] == 2 * DENSE.n_layers  # q, k and v in one call a layer, forward and backward


def test_the_loss_never_holds_the_full_logits():
    config = ModelConfig(vocab_size=50_304, d_model=64, n_layers=1, n_heads=4, n_kv_heads=4, ffn_dim=128,
                         max_seq_len=2048)
    model = build_on_meta(config, seed=0)
    tokens = torch.zeros(8, 2048, dtype=torch.long, device="meta")
    full_logits = 8 * 2048 * config.vocab_size * 4  # fp32 on meta
    with PeakBytes() as peak:
        _, loss = model(tokens, tokens)
        loss.backward()
    assert peak.peak < full_logits, f"peak {peak.peak / 1e9:.2f} GB >= full logits {full_logits / 1e9:.2f} GB"


@pytest.mark.parametrize("z_loss, parametrisation", [(0.0, "standard"), (1e-3, "mup")])
def test_chunked_loss_equals_the_full_logits_loss(monkeypatch, z_loss, parametrisation):
    lce = importlib.import_module("hymo_core.kernels.linear_cross_entropy")  # the module (the package exports the function)
    monkeypatch.setattr(lce, "CHUNK_ELEMENTS", 4 * 101)  # 4 rows a chunk: 5 chunks, the last ragged
    config = ModelConfig(vocab_size=101, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=32,
                         z_loss=z_loss, tie_embeddings=parametrisation == "standard", parametrisation=parametrisation,
                         **({"mup_base_width": 16} if parametrisation == "mup" else {}))
    torch.manual_seed(0)
    model = Transformer(config)
    tokens = torch.randint(0, 101, (2, 10))
    targets = torch.randint(0, 101, (2, 9))
    targets[1, 4:] = -100
    results = {}
    for fused in (True, False):
        model.zero_grad(set_to_none=True)
        logits, loss = model(tokens[:, :-1], targets, return_logits=not fused)
        loss.backward()
        assert (logits is None) == fused
        results[fused] = (loss.detach(), model.last_ce, [p.grad for p in model.parameters()])
    (loss_f, ce_f, grads_f), (loss_u, ce_u, grads_u) = results[True], results[False]
    torch.testing.assert_close(loss_f, loss_u, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ce_f, ce_u, rtol=1e-6, atol=1e-6)
    assert (loss_f > ce_f) == (z_loss > 0)
    for fused_grad, full_grad in zip(grads_f, grads_u):
        torch.testing.assert_close(fused_grad, full_grad, rtol=1e-5, atol=1e-7)


def test_chunked_loss_without_grad_and_rejecting_bad_shapes():
    hidden, weight = torch.randn(6, 8), torch.randn(11, 8)
    targets = torch.randint(0, 11, (6,))
    with torch.no_grad():
        objective, ce, _ = kernels.linear_cross_entropy(hidden, weight, targets, z_loss=1e-2, chunk=4)
    expected, expected_ce = kernels.cross_entropy_loss(hidden @ weight.T, targets, z_loss=1e-2)
    torch.testing.assert_close(objective, expected)
    torch.testing.assert_close(ce, expected_ce)
    with pytest.raises(ValueError, match="expected"):
        kernels.linear_cross_entropy(hidden, weight, targets[:5])

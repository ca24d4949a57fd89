"""MLA's SDPA call at its true widths (issue 54), or fitted to the FlashAttention backend (issue 42, part 8), with
the output unchanged.

Flash needs one head dim for q, k and v, a multiple of 8, at most 256. MLA's q/k heads are nope + rope
wide (192 at hymo-750m) and its values v_dim (128): v is zero-padded to 192 and the output sliced back.
The shapes reaching `F.scaled_dot_product_attention` are captured by wrapping it; the padded forward
and backward are compared with the same layer calling SDPA unpadded.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hymo_core.models.layers import mla
from hymo_core.models.model import ModelConfig, Transformer

BASE = dict(vocab_size=61, d_model=64, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=48, max_seq_len=32, layer_pattern="M",
            mla_q_lora_rank=48, mla_kv_lora_rank=32)
HYMO_750M_HEADS = dict(mla_qk_nope_head_dim=128, mla_qk_rope_head_dim=64, mla_v_head_dim=128)  # the preset's head dims


def captured_sdpa_calls(monkeypatch) -> list[dict]:
    calls, original = [], F.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        calls.append({"q": q.shape[-1], "k": k.shape[-1], "v": v.shape[-1], "scale": kwargs.get("scale")})
        return original(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


def run(model: Transformer, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits, _ = model(tokens)
    logits.square().mean().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("heads,width", [(HYMO_750M_HEADS, 192),
                                         (dict(mla_qk_nope_head_dim=20, mla_qk_rope_head_dim=6, mla_v_head_dim=12), 32),
                                         (dict(mla_qk_nope_head_dim=16, mla_qk_rope_head_dim=8, mla_v_head_dim=40), 40)],
                         ids=["750m-192-128", "qk26-v12", "qk24-v40"])
def test_sdpa_sees_flash_shapes_and_the_output_is_unchanged(monkeypatch, heads, width):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**BASE, **heads)).double()
    tokens = torch.randint(0, 61, (2, 17), generator=torch.Generator().manual_seed(1))
    calls = captured_sdpa_calls(monkeypatch)
    monkeypatch.setattr(mla, "attention_layout", lambda q, k, v, ctx: "padded")  # CUDA without cuDNN for these widths
    padded, padded_grads = run(model, tokens)
    qk_dim = heads["mla_qk_nope_head_dim"] + heads["mla_qk_rope_head_dim"]
    assert calls, "MLA did not call SDPA"
    for call in calls:
        assert call["q"] == call["k"] == call["v"] == width  # one head dim for all three
        assert call["q"] % 8 == 0 and call["q"] <= mla.FLASH_MAX_HEAD_DIM
        assert call["scale"] == pytest.approx(1.0 / math.sqrt(qk_dim))  # the real qk dim, not the padded one
    calls.clear()
    monkeypatch.undo()
    calls = captured_sdpa_calls(monkeypatch)  # the default here (CPU): the true widths
    plain, plain_grads = run(model, tokens)
    assert {(c["q"], c["v"]) for c in calls} == {(qk_dim, heads["mla_v_head_dim"])}
    torch.testing.assert_close(padded, plain, rtol=1e-12, atol=1e-12)
    assert padded_grads.keys() == plain_grads.keys()
    for name in plain_grads:
        torch.testing.assert_close(padded_grads[name], plain_grads[name], rtol=1e-10, atol=1e-12, msg=name)


def test_the_unpadded_output_is_the_textbook_attention():
    """The reference itself: softmax(q k^T / sqrt(qk)) v by hand, causal, for the 750m head dims."""
    generator = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, 2, 9, 192, generator=generator, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 2, 9, 128, generator=generator, dtype=torch.float64)
    from hymo_core.models.layers.context import MixerContext

    ctx = MixerContext(torch.empty(0), torch.empty(0))  # training: start 0, no cache, no rows
    scores = (q @ k.mT) / math.sqrt(192)
    scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    expected = scores.softmax(-1) @ v
    torch.testing.assert_close(mla.attend_padded(q, k, v, ctx), expected, rtol=1e-12, atol=1e-12)


def test_head_dims_flash_cannot_take_are_left_alone():
    assert mla.flash_head_dim(192, 128) == 192
    assert mla.flash_head_dim(26, 12) == 32
    assert mla.flash_head_dim(256, 256) == 256
    assert mla.flash_head_dim(320, 128) is None  # over 256: padding cannot help, SDPA picks another backend


def test_mla_runs_at_its_true_widths_with_rope_on_the_shared_key():
    """Counted on the meta device at hymo-750m's shapes (issue 54): no pad or slice around the attention, whose v is
    128 wide (cuDNN's kernel on sm_90, what the planner counts), and RoPE on the (B, S, 1, 64) shared rotary key
    (one head's worth), not on the keys expanded over 7 heads."""
    from hymo_core.models.layers.context import MixerContext
    from hymo_core.train.block_budget import meta_model
    from hymo_core.train.launch_count import LaunchCounter

    model = meta_model()
    attn = next(b.attn for b in model.layers if b.kind == "M")
    x = torch.empty(2, 4096, 896, device="meta", dtype=torch.bfloat16, requires_grad=True)
    counter = LaunchCounter()
    with counter, counter.phase("forward"):
        attn(x, MixerContext(model.rope_cos_TD2, model.rope_sin_TD2))
    ops = dict(counter.top(50, phase="forward"))
    assert "aten.constant_pad_nd" not in ops and "aten._scaled_dot_product_flash_attention" not in ops, ops
    assert ops["aten._scaled_dot_product_cudnn_attention"] == 1
    rope_bytes = counter.phases["forward"].bytes_by_op["hymo.rope.default"]
    q_rope_bytes = 2 * (2 * 4096 * 7 * 64 * 2)  # the queries' rotation: read + write, bf16 (tables aside)
    assert rope_bytes < q_rope_bytes * 1.5, rope_bytes  # the key's rotation adds a seventh, not 100 %

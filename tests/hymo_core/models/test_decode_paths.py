"""Cached decoding takes the cheap path of each mixer and still equals a full recomputation.

MLA: the latent cache is scored and read through weight absorption (kv_b_proj folded into the
query and output sides), so kv_b_proj never runs over the cache. GDN: one new token is one
recurrent step, never a chunked pass padded to a whole chunk.
"""
import pytest
import torch

import hymo_core.kernels.gdn as gdn_op
from hymo_core.models.model import ModelConfig, Transformer

HYBRID = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=48, max_seq_len=32,
              layer_pattern="GM")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**HYBRID, **overrides})).eval()


def decode(model: Transformer, tokens_BT: torch.Tensor, prefill: int) -> torch.Tensor:
    cache = model.new_cache(tokens_BT.shape[0])
    logits = [model(tokens_BT[:, :prefill], cache=cache)[0]]
    logits += [model(tokens_BT[:, t:t + 1], cache=cache)[0] for t in range(prefill, tokens_BT.shape[1])]
    return torch.cat(logits, dim=1)


class Calls:
    def __init__(self):
        self.count = 0

    def hook(self, *args):
        self.count += 1


def test_mla_cached_decoding_absorbs_kv_b_proj_and_equals_full_recomputation():
    model = build()
    mla = model.layers[1].attn
    tokens = torch.randint(0, 61, (2, 11), generator=torch.Generator().manual_seed(3))
    full = model(tokens)[0]
    expansions = Calls()
    handle = mla.kv_b_proj.register_forward_pre_hook(expansions.hook)
    try:
        cached = decode(model, tokens, prefill=4)
    finally:
        handle.remove()
    assert expansions.count == 0  # neither the prefill nor the steps expanded keys and values
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)


def test_mla_with_qk_norm_decodes_by_expansion_and_still_agrees():
    """QK-norm normalises whole expanded keys, which does not commute with absorption: expansion is kept."""
    model = build(qk_norm=True)
    tokens = torch.randint(0, 61, (1, 9), generator=torch.Generator().manual_seed(4))
    expansions = Calls()
    handle = model.layers[1].attn.kv_b_proj.register_forward_pre_hook(expansions.hook)
    try:
        cached = decode(model, tokens, prefill=3)
    finally:
        handle.remove()
    assert expansions.count == 1 + 6
    torch.testing.assert_close(cached, model(tokens)[0], rtol=1e-5, atol=1e-5)


def test_gdn_single_token_decoding_is_the_recurrent_step(monkeypatch):
    model = build()
    tokens = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(5))
    full = model(tokens)[0]
    chunked, recurrent = [], []
    real_chunked, real_recurrent = gdn_op.gated_delta_rule_chunked, gdn_op.gated_delta_rule_recurrent
    monkeypatch.setattr(gdn_op, "gated_delta_rule_chunked",
                        lambda q, *a, **k: chunked.append(q.shape[1]) or real_chunked(q, *a, **k))
    monkeypatch.setattr(gdn_op, "gated_delta_rule_recurrent",
                        lambda q, *a, **k: recurrent.append(q.shape[1]) or real_recurrent(q, *a, **k))
    cached = decode(model, tokens, prefill=4)
    assert chunked == [4]  # the prefill only
    assert recurrent == [1] * 6  # one recurrent step per decoded token
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)

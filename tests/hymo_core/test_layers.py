"""The block interface: layer patterns, caches (cached decoding == full forward), hooks."""

import pytest
import torch

from hymo_core.model import ModelConfig, Transformer

DENSE = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=32)


def build(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**DENSE, **overrides})).eval()


def cached_logits(model: Transformer, tokens_BT: torch.Tensor, pieces: list[int]) -> torch.Tensor:
    """Feed tokens through one cache in pieces of the given lengths; concatenate the logits."""
    cache = model.new_cache(tokens_BT.shape[0])
    out, start = [], 0
    for length in pieces:
        logits, _ = model(tokens_BT[:, start:start + length], cache=cache)
        out.append(logits)
        start += length
    assert cache.position == start
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("overrides", [{}, dict(qk_norm=True), dict(n_kv_heads=4)])
def test_dense_cached_decoding_equals_full_forward(overrides):
    model = build(**overrides)
    tokens = torch.randint(0, 61, (2, 13), generator=torch.Generator().manual_seed(1))
    full, _ = model(tokens)
    # a multi-token prefill, single steps, then a chunk that continues the cache
    torch.testing.assert_close(cached_logits(model, tokens, [5, 1, 1, 4, 2]), full, rtol=1e-5, atol=1e-5)


def test_cache_refuses_to_run_past_max_seq_len():
    model = build(max_seq_len=8)
    cache = model.new_cache(1)
    model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_layer_pattern_repeats_to_n_layers_and_validates():
    assert ModelConfig(**{**DENSE, "n_layers": 5}).layer_kinds() == ("A",) * 5
    with pytest.raises(ValueError, match="layer_pattern"):
        ModelConfig(**{**DENSE, "layer_pattern": "AX"})
    with pytest.raises(ValueError, match="moe_on"):
        ModelConfig(**{**DENSE, "moe_on": "Q"})


def test_dense_parameter_names_are_unchanged():
    names = set(build().state_dict())
    assert {"layers.1.attn.q_proj.weight", "layers.1.attn.o_proj.weight", "layers.0.ffn.down_proj.weight",
            "layers.0.attn_norm.weight", "layers.0.ffn_norm.weight", "norm.weight", "tok_embeddings.weight"} <= names

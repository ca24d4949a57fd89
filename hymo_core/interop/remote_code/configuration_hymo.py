"""Configuration of a HyMo hybrid exported for transformers (shipped beside modeling_hymo.py).

Every size is written resolved by `hymo export --hf` (no derivation rules here), so this file
and the modeling file depend on nothing but torch and transformers.
"""
from __future__ import annotations

from transformers import PretrainedConfig


class HymoConfig(PretrainedConfig):
    model_type = "hymo"

    def __init__(self, vocab_size: int = 8192, hidden_size: int = 256, num_hidden_layers: int = 4,
                 num_attention_heads: int = 8, num_key_value_heads: int = 8, intermediate_size: int = 688,
                 max_position_embeddings: int = 256, rope_theta: float = 10000.0, rope_dim: int = 32,
                 rms_norm_eps: float = 1e-5, qk_norm: bool = False, layer_kinds: list[str] | None = None,
                 moe_kinds: str = "", gdn: dict | None = None, mla: dict | None = None, moe: dict | None = None,
                 tie_word_embeddings: bool = True, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rope_dim = rope_dim  # width of the rotated part of a head: one RoPE table for the whole stack
        self.rms_norm_eps = rms_norm_eps
        self.qk_norm = qk_norm
        self.layer_kinds = list(layer_kinds or ["A"] * num_hidden_layers)  # "A" GQA, "G" Gated DeltaNet, "M" MLA
        self.moe_kinds = moe_kinds  # mixer kinds whose feed-forward is DeepSeekMoE
        self.gdn = dict(gdn or {})  # heads, key_head_dim, value_head_dim, conv_size
        self.mla = dict(mla or {})  # q_rank, kv_rank, nope_dim, rope_dim, v_dim
        self.moe = dict(moe or {})  # routed, activated, shared, expert_dim, score_function, route_scale, capacity_factor
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

"""Named model shapes a recipe can start from: `preset = "hymo-tiny"` in a [model] table.

Other keys in the same table override the preset's values. Torch-free, like
configs.py, so the planner and the pipeline's config loader can use it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from typing import Any

from hymo_core.models.configs import SAMPLE_MODEL, ModelConfig

PRESETS: dict[str, ModelConfig] = {
    # The hybrid at the sample recipe's size: the dense sample model's d_model, depth and heads,
    # one "GGGM" period; value width 1x and FFN 320 bring it to the dense model's parameter
    # count (1,846,104 vs 1,840,256 with the sample's 8,192-token vocabulary).
    # The full recipe on by default (seed 000): MoE on the MLA layer (8 routed experts, 2 active, one
    # shared, each 80 wide) and MTP depth 2; `moe_on = ""` / `mtp_depth = 0` give the plain hybrid.
    "hymo-tiny": replace(SAMPLE_MODEL, layer_pattern="GGGM", gdn_expand_v=1, ffn_dim=320, moe_on="M",
                         moe_n_routed_experts=8, moe_n_activated_experts=2, moe_n_shared_experts=1, moe_expert_dim=80,
                         mtp_depth=2),
    # Seed 000's production shape: d 896, BPE 64,000 + 256 byte fallback, "GGGM" x 8 (24 GDN + 8 MLA),
    # dense FFN 2304 wide (the seed's 6.2 M MACs per layer), T = 4096, untied head.
    # MoE on the 8 MLA layers: 16 routed experts (the seed's 16-way gate) of inner width 2304, one
    # active plus one shared (the seed's 12 M MACs per MoE layer = 2 x 3 x 896 x 2304); MTP depth 2.
    "hymo-750m": ModelConfig(
        vocab_size=64_256, d_model=896, n_layers=32, n_heads=7, n_kv_heads=7, ffn_dim=2304, max_seq_len=4096,
        tie_embeddings=False, layer_pattern="GGGM", gdn_n_heads=7, gdn_head_dim=128, gdn_expand_v=2,
        mla_q_lora_rank=384, mla_kv_lora_rank=256, mla_qk_nope_head_dim=128, mla_qk_rope_head_dim=64,
        mla_v_head_dim=128, moe_on="M", moe_n_routed_experts=16, moe_n_activated_experts=1, moe_n_shared_experts=1,
        moe_expert_dim=2304, moe_score_function="softmax", mtp_depth=2,
    ),
    # The dense speed reference: GPT-2 small's shape (llm.c's GPT-2 124M, modded-nanogpt), ~124 M parameters
    # with the tied 50,304-token table; T = 2048. What bench/gpu_check.py's dense MFU and profile rows train,
    # and the launch budget (hymo_core/train/launch_budget.py) counts.
    "dense-125m": ModelConfig(vocab_size=50_304, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_dim=2048,
                              max_seq_len=2048, tie_embeddings=True),
}

# The [train] defaults a preset brings (a recipe's own [train] keys still win): seed 000's dual
# optimizer, NorMuon + CautiousAdamW with cautious weight decay. `optimizer = "muon_adamw"` turns it off.
PRESET_TRAINING: dict[str, dict[str, Any]] = {
    name: {"optimizer": "normuon", "cautious_weight_decay": True} for name in ("hymo-tiny", "hymo-750m", "dense-125m")
}


def preset_training(table: Mapping[str, Any]) -> dict[str, Any]:
    """The [train] defaults of a [model] table's preset ({} without one)."""
    return dict(PRESET_TRAINING.get(table.get("preset", ""), {}))


def model_config_from_table(table: Mapping[str, Any], base: ModelConfig, where: str) -> ModelConfig:
    """`base` (or the table's preset) with the table's other keys applied; errors name `where`."""
    values = dict(table)
    name = values.pop("preset", None)
    if name is not None:
        if name not in PRESETS:
            raise ValueError(f"{where}: unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
        base = PRESETS[name]
    unknown = sorted(set(values) - {f.name for f in fields(ModelConfig)})
    if unknown:
        raise ValueError(f"{where}: unknown [model] keys {unknown}")
    try:
        return replace(base, **values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc


def expand_preset(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A [model] table with its preset resolved into plain ModelConfig keys (ModelConfig defaults beneath)."""
    if "preset" not in table:
        return dict(table)
    return asdict(model_config_from_table(table, ModelConfig(), where))

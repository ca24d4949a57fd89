"""Which transformers architecture a HyMo model is, its config.json, and its weights under transformers' names.

The dense decoder (every layer kind "A", no MoE) is exactly Llama (pre-RMSNorm, half-split RoPE,
SwiGLU, GQA, no biases), or Qwen3 when it has per-head QK-norm before RoPE. Everything else is the
hybrid, shipped as `HymoForCausalLM` (remote_code/modeling_hymo.py) with every size written resolved.
Multi-token prediction is training-only: its weights are not exported, nor the MoE balancing
counters (only the gate bias, which picks experts, is).
"""
from __future__ import annotations

from typing import Any

import torch

from hymo_core.models.configs import ModelConfig

HYBRID = "HymoForCausalLM"
# config.json's transformers_version: the oldest transformers that loads this layout (the `interop` extra's
# lower bound), written as a constant so the same checkpoint exports to the same bytes wherever it runs.
TRANSFORMERS_VERSION = "5.24.0"
REMOTE_CODE_FILES = ("configuration_hymo.py", "modeling_hymo.py")
TRAINING_ONLY_BUFFERS = ("load_ema_E", "tokens_per_expert_E", "dropped_assignments")


def architecture(config: ModelConfig) -> str:
    """LlamaForCausalLM, Qwen3ForCausalLM or the shipped hybrid."""
    if set(config.layer_pattern) == {"A"} and not config.moe_on:
        return "Qwen3ForCausalLM" if config.qk_norm else "LlamaForCausalLM"
    return HYBRID


def hf_config(config: ModelConfig, eos_id: int, pad_id: int) -> dict[str, Any]:
    """config.json's content for `config`'s architecture."""
    arch = architecture(config)
    common = {
        "architectures": [arch], "vocab_size": config.vocab_size, "hidden_size": config.d_model,
        "intermediate_size": config.ffn_dim, "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads, "num_key_value_heads": config.n_kv_heads,
        "max_position_embeddings": config.max_seq_len, "rms_norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_embeddings, "bos_token_id": None, "eos_token_id": eos_id,
        "pad_token_id": pad_id, "dtype": "float32", "torch_dtype": "float32", "use_cache": True,
        "transformers_version": TRANSFORMERS_VERSION,
        # top level too (tools that predate rope_parameters read it there); `hymo extend --position base` changes it
        "rope_theta": config.rope_base,
    }
    if arch != HYBRID:
        dense = {"model_type": "qwen3" if config.qk_norm else "llama", "head_dim": config.head_dim, "hidden_act": "silu",
                 "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_base},
                 "attention_bias": False, "attention_dropout": 0.0}
        if config.qk_norm:
            dense.update({"use_sliding_window": False, "sliding_window": None, "max_window_layers": config.n_layers})
        else:
            dense["mlp_bias"] = False
        return {**common, **dense}
    moe = config.moe_config()
    return {
        **common, "model_type": "hymo",
        "auto_map": {"AutoConfig": "configuration_hymo.HymoConfig", "AutoModelForCausalLM": "modeling_hymo.HymoForCausalLM"},
        "rope_dim": config.rope_dim, "qk_norm": config.qk_norm,
        "layer_kinds": list(config.layer_kinds()), "moe_kinds": config.moe_on,
        "gdn": {"heads": config.gdn_heads, "key_head_dim": config.gdn_key_head_dim,
                "value_head_dim": config.gdn_value_head_dim, "conv_size": config.gdn_conv_size},
        "mla": {"q_rank": config.mla_q_rank, "kv_rank": config.mla_kv_rank, "nope_dim": config.mla_nope_dim,
                "rope_dim": config.mla_rope_dim, "v_dim": config.mla_v_dim},
        "moe": {"routed": moe.n_routed_experts, "activated": moe.n_activated_experts, "shared": moe.n_shared_experts,
                "expert_dim": moe.expert_dim, "score_function": moe.score_function, "route_scale": moe.route_scale,
                "capacity_factor": moe.capacity_factor},
    }


def _dense_name(name: str) -> str:
    """HyMo's dense parameter name -> Llama / Qwen3's."""
    parts = name.split(".")
    layer, rest = parts[1], ".".join(parts[2:])
    renamed = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight"}
    if rest in renamed:
        return f"model.layers.{layer}.{renamed[rest]}"
    if rest.startswith("attn."):
        return f"model.layers.{layer}.self_attn.{rest.removeprefix('attn.')}"
    if rest.startswith("ffn."):
        return f"model.layers.{layer}.mlp.{rest.removeprefix('ffn.')}"
    raise ValueError(f"no Llama / Qwen3 name for HyMo weight {name!r}")


def hf_state_dict(config: ModelConfig, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights transformers loads, under its names: contiguous copies, MTP and MoE counters left out."""
    dense = architecture(config) != HYBRID
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        if name.startswith("mtp.") or name.endswith(TRAINING_ONLY_BUFFERS):
            continue
        if name == "tok_embeddings.weight":
            target = "model.embed_tokens.weight"
        elif name == "output.weight":
            if config.tie_embeddings:
                continue  # transformers ties lm_head to the embedding itself
            target = "lm_head.weight"
        elif name == "norm.weight":
            target = "model.norm.weight"
        elif dense:
            target = _dense_name(name)
        else:
            target = "model." + name.replace("expert_bias_E", "expert_bias")
        out[target] = tensor.detach().to("cpu").clone().contiguous()
    return out

"""The widths each preset launches its kernels at, for the offline resource check (hymo_core/kernels/aot.py).

The presets are the dense sample, hymo-tiny, hymo-750m, and Lab 4's case study (seed 001: d 4096,
32 heads of 128, vocabulary 152,064). Lab 4 is all attention; its row gives the GDN kernels a
128 / 128 key / value head, the size a GDN at that width would use.
"""

from __future__ import annotations

from hymo_core.kernels.aot import ModelKernelShapes
from hymo_core.models.configs import SAMPLE_MODEL, ModelConfig
from hymo_core.models.presets import PRESETS

LAB4 = ModelConfig(vocab_size=152064, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, ffn_dim=15360,
                   max_seq_len=4096, layer_pattern="A")
LAB4_GDN_HEADS = 7  # grids are counted at hymo-750m's batch x heads


def kernel_shapes(preset: str, config: ModelConfig) -> ModelKernelShapes:
    kinds = config.layer_pattern
    norms = {config.d_model}
    probes = set()
    if "G" in kinds:
        norms.add(config.gdn_value_head_dim)
    if "M" in kinds:
        qk = config.mla_nope_dim + config.mla_rope_dim
        norms |= {config.mla_q_rank, config.mla_kv_rank} | ({qk} if config.qk_norm else set())
        probes.add(qk)
    if "A" in kinds:
        norms |= {config.head_dim} if config.qk_norm else set()
        probes.add(config.head_dim)
    if "G" in kinds:
        gdn = (config.gdn_key_head_dim, config.gdn_value_head_dim, config.gdn_heads)
    elif config is LAB4:
        gdn = (config.head_dim, config.head_dim, LAB4_GDN_HEADS)
    else:
        gdn = None
    moe = ((config.moe_n_routed_experts, config.moe_n_activated_experts, config.d_model,
            config.moe_score_function == "sigmoid") if config.moe_on else None)
    return ModelKernelShapes(preset, tuple(sorted(norms)), config.rope_dim, config.n_heads, config.ffn_dim,
                             config.vocab_size, tuple(sorted(probes)), gdn, moe, config.gdn_conv_size)


def preset_kernel_shapes() -> list[ModelKernelShapes]:
    configs = {"dense sample": SAMPLE_MODEL, "hymo-tiny": PRESETS["hymo-tiny"], "hymo-750m": PRESETS["hymo-750m"],
               "lab-4": LAB4}
    return [kernel_shapes(name, config) for name, config in configs.items()]

"""Model configs, importable without torch.

Pipeline configs, the Prefect flow's parameter form and every worker process
import these dataclasses; keeping them free of torch keeps `hymo` and each
worker from paying torch's multi-second import before any training happens.
The training recipe's config is beside the loop it configures (hymo_core/train/config.py).
"""
from __future__ import annotations

from dataclasses import dataclass

MIXER_KINDS = "AGM"  # layer_pattern letters a model can be built from (hymo_core/models/layers/block.py)
SCORE_FUNCTIONS = ("sigmoid", "softmax")
PARAMETRISATIONS = ("standard", "mup")


@dataclass(frozen=True)
class MoEConfig:
    """DeepSeekMoE's knobs (hymo_core/models/layers/moe.py); ModelConfig's moe_* fields build it (moe_config())."""

    n_routed_experts: int = 8
    n_activated_experts: int = 2  # top-k
    n_shared_experts: int = 1  # one SwiGLU of width n_shared * expert_dim, as DeepSeek builds it
    expert_dim: int = 128  # each routed expert's SwiGLU inner width (production: 2304)
    score_function: str = "sigmoid"  # DeepSeek-V3: sigmoid; V2: softmax
    route_scale: float = 1.0
    bias_update_rate: float = 1e-3  # gamma of the sign rule (DeepSeek-V3)
    bias_update: bool = True  # off: the bias stays 0 (the ablation)
    load_ema_decay: float = 0.9  # EMA of the per-update loads the sign rule reads; 0 = this update only
    capacity_factor: float = 0.0  # 0 = no token dropping
    aux_loss_weight: float = 0.0  # sequence-wise balance loss (alpha); 0 = aux-loss-free only

    def __post_init__(self) -> None:
        if not 1 <= self.n_activated_experts <= self.n_routed_experts:
            raise ValueError(f"need 1 <= n_activated_experts ({self.n_activated_experts}) <= n_routed_experts ({self.n_routed_experts})")
        if self.score_function not in SCORE_FUNCTIONS:
            raise ValueError(f"score_function must be one of {SCORE_FUNCTIONS}, got {self.score_function!r}")
        if self.n_shared_experts < 0 or self.expert_dim < 1:
            raise ValueError("n_shared_experts must be >= 0 and expert_dim >= 1")
        if not 0 <= self.load_ema_decay < 1:
            raise ValueError(f"load_ema_decay must lie in [0, 1), got {self.load_ema_decay}")
        if min(self.bias_update_rate, self.capacity_factor, self.aux_loss_weight, self.route_scale) < 0:
            raise ValueError("bias_update_rate, capacity_factor, aux_loss_weight and route_scale must be >= 0")


@dataclass(frozen=True)
class ModelConfig:
    """Defaults are Lab 2's CPU model (5,795,072 parameters)."""

    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 8
    ffn_dim: int = 688  # ~8/3 d, SwiGLU's usual width for the same FLOPs as a 4d MLP
    max_seq_len: int = 256
    rope_base: float = 10000.0
    rope_position_scale: float = 1.0  # position interpolation (hymo extend): RoPE angles at position / scale
    tie_embeddings: bool = True
    qk_norm: bool = False
    init_std: float = 0.02
    norm_eps: float = 1e-5
    z_loss: float = 0.0  # coefficient of mean(logsumexp^2); Lab 3 tries 1e-4
    # The stack (hymo_core/models/layers/__init__.py): one mixer letter per layer, the pattern
    # repeated to n_layers. "A" = GQA attention (the dense decoder), "G" = Gated DeltaNet,
    # "M" = Multi-head Latent Attention. `moe_on` names the mixer kinds whose FFN is MoE.
    layer_pattern: str = "A"
    moe_on: str = ""
    # Gated DeltaNet (kind "G"); 0 = derive: heads = n_heads, key head dim = head_dim.
    gdn_n_heads: int = 0
    gdn_head_dim: int = 0
    gdn_expand_v: int = 2  # value head dim = expand_v x key head dim (fla's default)
    gdn_conv_size: int = 4  # short causal depthwise conv on q, k, v
    # Multi-head Latent Attention (kind "M", DeepSeek-V2 names); 0 = derive from d_model / head_dim.
    mla_q_lora_rank: int = 0  # 0 = d_model // 2
    mla_kv_lora_rank: int = 0  # 0 = d_model // 4: the per-token latent the KV cache stores
    mla_qk_nope_head_dim: int = 0  # 0 = head_dim
    mla_qk_rope_head_dim: int = 0  # 0 = head_dim // 2: the decoupled RoPE key, shared by all heads
    mla_v_head_dim: int = 0  # 0 = head_dim
    # DeepSeekMoE on the layers `moe_on` names (hymo_core/models/layers/moe.py; MoEConfig below says what each does).
    moe_n_routed_experts: int = 8
    moe_n_activated_experts: int = 2
    moe_n_shared_experts: int = 1
    moe_expert_dim: int = 0  # 0 = ffn_dim (seed 000: 2304, the dense FFN's width)
    moe_score_function: str = "sigmoid"
    moe_route_scale: float = 1.0
    moe_bias_update: bool = True
    moe_bias_update_rate: float = 1e-3
    moe_load_ema_decay: float = 0.9
    moe_capacity_factor: float = 0.0
    moe_aux_loss_weight: float = 0.0
    # Multi-token prediction (hymo_core/models/layers/mtp.py): depth D, one loss weight per depth; 0 = off.
    mtp_depth: int = 0
    mtp_loss_weights: tuple[float, ...] = (0.3, 0.1)
    # Whether each MTP depth's block has the trunk kind's MoE FFN (DeepSeek-V3) or a dense SwiGLU of
    # ffn_dim (seed 000: "8 DeepSeekMoE in the production model - one per MLA layer"; docs/training.md).
    mtp_moe: bool = False
    # "standard", or "mup" (hymo_core/models/mup.py): muP's init, per-layer LR and output multiplier, relative to
    # a proxy of width mup_base_width (0 = this d_model: the proxy itself), so a tuned LR transfers across widths.
    parametrisation: str = "standard"
    mup_base_width: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mtp_loss_weights", tuple(float(w) for w in self.mtp_loss_weights))  # TOML gives lists
        if self.mtp_depth < 0 or len(self.mtp_loss_weights) < self.mtp_depth:
            raise ValueError(f"mtp_depth {self.mtp_depth} needs >= 0 and one of mtp_loss_weights {self.mtp_loss_weights} per depth")
        if not self.rope_position_scale >= 1.0 or not self.rope_base > 0:
            raise ValueError(f"rope_position_scale must be >= 1 and rope_base > 0, got {self.rope_position_scale}, {self.rope_base}")
        if self.parametrisation not in PARAMETRISATIONS:
            raise ValueError(f"parametrisation must be one of {PARAMETRISATIONS}, got {self.parametrisation!r}")
        if self.mup_base_width < 0 or (self.mup_base_width and self.parametrisation != "mup"):
            raise ValueError(f"mup_base_width {self.mup_base_width} needs parametrisation = \"mup\" and must be >= 0")
        if self.moe_on:
            self.moe_config()  # raises on inconsistent MoE settings
        if not self.layer_pattern or set(self.layer_pattern) - set(MIXER_KINDS):
            raise ValueError(f"layer_pattern {self.layer_pattern!r} must be letters from {MIXER_KINDS!r}")
        if set(self.moe_on) - set(self.layer_pattern):
            raise ValueError(f"moe_on {self.moe_on!r} names kinds absent from layer_pattern {self.layer_pattern!r}")
        for name in ("gdn_n_heads", "gdn_head_dim", "mla_q_lora_rank", "mla_kv_lora_rank", "mla_qk_nope_head_dim",
                     "mla_qk_rope_head_dim", "mla_v_head_dim"):
            if getattr(self, name) < 0:
                raise ValueError(f"ModelConfig.{name} must be >= 0 (0 = derived), got {getattr(self, name)}")
        if self.gdn_expand_v < 1 or self.gdn_conv_size < 1:
            raise ValueError("gdn_expand_v and gdn_conv_size must be >= 1")
        if "A" in self.layer_pattern and "M" in self.layer_pattern and self.mla_rope_dim != self.head_dim:
            raise ValueError("kinds A and M share one RoPE table: mla_qk_rope_head_dim must equal head_dim")
        if "M" in self.layer_pattern and self.mla_rope_dim % 2:
            raise ValueError(f"mla_qk_rope_head_dim {self.mla_rope_dim} must be even for RoPE")
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be divisible by n_heads")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be divisible by n_kv_heads")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError("head_dim must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def gdn_heads(self) -> int:
        return self.gdn_n_heads or self.n_heads

    @property
    def gdn_key_head_dim(self) -> int:
        return self.gdn_head_dim or self.head_dim

    @property
    def gdn_value_head_dim(self) -> int:
        return self.gdn_expand_v * self.gdn_key_head_dim

    @property
    def mla_q_rank(self) -> int:
        return self.mla_q_lora_rank or self.d_model // 2

    @property
    def mla_kv_rank(self) -> int:
        return self.mla_kv_lora_rank or self.d_model // 4

    @property
    def mla_nope_dim(self) -> int:
        return self.mla_qk_nope_head_dim or self.head_dim

    @property
    def mla_rope_dim(self) -> int:
        return self.mla_qk_rope_head_dim or self.head_dim // 2

    @property
    def mla_v_dim(self) -> int:
        return self.mla_v_head_dim or self.head_dim

    @property
    def rope_dim(self) -> int:
        """Width of the rotated part of a query/key head (the model's one RoPE table)."""
        return self.mla_rope_dim if "A" not in self.layer_pattern and "M" in self.layer_pattern else self.head_dim

    def moe_config(self) -> "MoEConfig":
        return MoEConfig(n_routed_experts=self.moe_n_routed_experts, n_activated_experts=self.moe_n_activated_experts,
                         n_shared_experts=self.moe_n_shared_experts, expert_dim=self.moe_expert_dim or self.ffn_dim,
                         score_function=self.moe_score_function, route_scale=self.moe_route_scale,
                         bias_update=self.moe_bias_update,
                         bias_update_rate=self.moe_bias_update_rate, load_ema_decay=self.moe_load_ema_decay,
                         capacity_factor=self.moe_capacity_factor, aux_loss_weight=self.moe_aux_loss_weight)

    def layer_kinds(self) -> tuple[str, ...]:
        """One mixer letter per layer: layer_pattern repeated (and cut) to n_layers."""
        repeats = -(-self.n_layers // len(self.layer_pattern))
        return tuple((self.layer_pattern * repeats)[: self.n_layers])


# The sample model (docs/benchmarks.md): ~1.8 M parameters with the sample's 8,192-token vocabulary
# (1 M of them the tied embedding).
SAMPLE_MODEL = ModelConfig(d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=344, max_seq_len=64)

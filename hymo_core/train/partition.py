"""Which optimizer, and which weight decay, each parameter gets: one table for both optimizers.

Seed 000 §2.1 ("goes_to_adamw") decides by name: the dense 2-D hidden matrices are orthogonalised
(Muon / NorMuon), everything else goes to AdamW. Rules are checked in order and the first match
wins; every parameter's rule name is recorded, so a reviewer (or the golden test) can see why it
landed where it did. Names are matched on whole dotted components, so a top-level `gate.weight`
and `layers.3.ffn.gate.weight` match alike while the dense SwiGLU's `gate_proj.weight` does not.

Each rule names a *kind*, and the kind alone fixes the weight decay (seed 000 §3.3), for both
optimizers:

    matrix      orthogonalised; decayed (the optimizer's matrix decay)
    embed_head  AdamW; decayed (the embedding / head decay): one row per token, and the seed keeps
                0.1 on them so rare tokens' rows do not grow without bound
    no_decay    AdamW; never decayed:
                - norm gains, biases, other vectors: decay pulls a gain towards 0, not towards a
                  simpler function;
                - MoE router gates: their scale is the routing temperature; the gate bias, not
                  decay, balances the load;
                - routed and shared experts: the seed keeps them on plain AdamW, undecayed, so
                  that load balancing sees experts whose size only the data sets;
                - GDN's A_log / dt_bias: they parametrise decay rates, so shrinking them moves the
                  state's memory horizon;
                - GDN's gate projections a_proj / b_proj (H x d: 7 x 896 at hymo-750m, 48 of them):
                  they write one number per head (the decay's and beta's pre-activations), a
                  router-like signal whose scale is the gate's sharpness, and a 7-row matrix gains
                  nothing from Newton-Schulz. A departure from seed 000 §2.1, whose table leaves
                  every 2-D mixer matrix to NorMuon (issue 54; docs/training.md says why);
                - stacked (3-D+) weights and the GDN short-convolution kernels.

Each optimizer maps the kinds to its own group names (kept as they were, so existing checkpoints
and their optimizer layouts still load): MuonAdamW "muon" / "adamw" / "adamw_no_decay", NorMuon
"normuon" / "adamw_embed_head" / "adamw".
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn

KINDS = ("matrix", "embed_head", "no_decay")
UNNAMED_MATRIX_RULE = "unnamed_matrix"  # the seed's fall-through to the matrix optimizer; the golden test refuses it

# The seed's dense matrices, by the name of the module that owns them: GQA attention, MLA, GDN,
# the dense SwiGLU, and MTP's [hidden; embedding] -> d projection.
DENSE_MATRIX_MODULES = frozenset({
    "q_proj", "k_proj", "v_proj", "o_proj",
    "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "wq", "wk", "wv", "wo",
    "in_proj", "out_proj", "g_proj",  # GDN: its in_proj split by output (fla's names); a_proj / b_proj are gates
    "gate_proj", "up_proj", "down_proj",
    "proj",
})


@dataclass(frozen=True)
class PartitionRule:
    name: str
    kind: str  # one of KINDS
    matches: Callable[[str, torch.Tensor], bool]


def _owner_is(*module_names: str) -> Callable[[str, torch.Tensor], bool]:
    """True when the parameter's own module (the name's second-to-last part) is one of these."""
    def matches(name: str, param: torch.Tensor) -> bool:
        parts = name.split(".")
        return len(parts) >= 2 and parts[-2] in module_names

    return matches


def _inside(*module_names: str) -> Callable[[str, torch.Tensor], bool]:
    """True when any enclosing module in the dotted name is one of these."""
    return lambda name, param: any(part in module_names for part in name.split(".")[:-1])


def _called(*parameter_names: str) -> Callable[[str, torch.Tensor], bool]:
    return lambda name, param: name.split(".")[-1] in parameter_names


def _norm_gain(name: str, param: torch.Tensor) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2].endswith("norm")


# Seed 000 §2.1, one row per condition, in the order it is checked. Our embedding and head are
# `tok_embeddings` / `output`; the seed's `embed` / `head` are listed too.
PARTITION_RULES: tuple[PartitionRule, ...] = (
    PartitionRule("embedding", "embed_head", _owner_is("embed", "embedding", "embeddings", "tok_embeddings", "wte")),
    PartitionRule("output_head", "embed_head", _owner_is("head", "lm_head", "output")),
    PartitionRule("moe_gate", "no_decay", _owner_is("gate", "router")),
    PartitionRule("routed_experts", "no_decay", _inside("experts")),
    PartitionRule("shared_expert", "no_decay", _inside("shared_expert", "shared_experts")),
    PartitionRule("gdn_scalars", "no_decay", _called("A_log", "dt_bias")),
    PartitionRule("gdn_gates", "no_decay", lambda name, param: param.ndim == 2 and _owner_is("a_proj", "b_proj")(name, param)),
    PartitionRule("norm_gain", "no_decay", _norm_gain),
    PartitionRule("vector", "no_decay", lambda name, param: param.ndim < 2),
    PartitionRule("tensor_3d_or_more", "no_decay", lambda name, param: param.ndim > 2),
    PartitionRule("dense_matrix", "matrix", lambda name, param: param.ndim == 2 and _owner_is(*DENSE_MATRIX_MODULES)(name, param)),
    PartitionRule(UNNAMED_MATRIX_RULE, "matrix", lambda name, param: param.ndim == 2),
)


@dataclass(frozen=True)
class ParamAssignment:
    name: str
    shape: tuple[int, ...]
    group: str  # the optimizer's group name for this parameter's kind
    rule: str
    kind: str


def partition_parameters(
    named_parameters: Iterable[tuple[str, nn.Parameter]],
    group_names: dict[str, str] | None = None,
    rules: tuple[PartitionRule, ...] = PARTITION_RULES,
) -> list[tuple[ParamAssignment, nn.Parameter]]:
    """Assign each trainable parameter a kind by the first matching rule; `group_names` maps kinds to groups."""
    group_names = group_names or {kind: kind for kind in KINDS}
    assigned = []
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        rule = next((r for r in rules if r.matches(name, param)), None)
        if rule is None:
            raise ValueError(f"no partition rule matches parameter {name} {tuple(param.shape)}")
        assigned.append((ParamAssignment(name, tuple(param.shape), group_names[rule.kind], rule.name, rule.kind), param))
    return assigned


def weight_decay_for(kind: str, matrix_decay: float, embed_head_decay: float) -> float:
    """The one weight-decay rule set (module docstring): what each kind is decayed by."""
    return {"matrix": matrix_decay, "embed_head": embed_head_decay, "no_decay": 0.0}[kind]

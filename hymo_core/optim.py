"""One optimizer object: Muon for hidden 2-D matrices, AdamW for everything else.

Which parameter goes where is decided by an explicit, ordered rule table
(seed 000, "Parameter partitioning"): first matching rule wins, and every
parameter's rule name is recorded so a reviewer, or a checkpoint, can see
why it landed in its group. A new kind of 2-D matrix falls through to Muon
unless a rule says otherwise.

Muon (Keller Jordan; Moonlight): Nesterov momentum, then the quintic
Newton-Schulz iteration (3.4445, -4.7750, 2.0315) x 5 pushes the update's
singular values towards 1. The update is rescaled by 0.2 sqrt(max(A, B)) so
its RMS matches AdamW's (~0.2); the AdamW learning rate and weight decay
therefore carry over to Muon groups unchanged, and one schedule drives all
groups. Newton-Schulz runs in bf16 by default (its purpose is a direction,
not precision); fp32/fp64 are available (seed 002: chosen independently of
the parameters' dtype).

Cautious weight decay (seed 000): decay a coordinate only where the update
already moves it towards zero (sign(update) == sign(param)), so decay never
fights the gradient. Off by default, which keeps the Muon groups identical to
`torch.optim.Muon(adjust_lr_fn="match_rms_adamw")` and the AdamW groups to
`torch.optim.AdamW`; the tests hold both to that.

A single object means one `step`, one `zero_grad`, one `state_dict`, one LR
assignment, and one GradScaler `unscale_` for the whole model (seed 002).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn

from hymo_core.configs import NS_DTYPE_NAMES

try:  # FSDP2 shards parameters as DTensors; Newton-Schulz needs the whole matrix.
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None

NS_DTYPES = {name: getattr(torch, name) for name in NS_DTYPE_NAMES}
MUON_LR_ADJUSTMENTS = ("match_rms_adamw", "original", "none")
GROUPS = ("muon", "adamw", "adamw_no_decay")


# ---------------------------------------------------------------- partitioning


@dataclass(frozen=True)
class PartitionRule:
    name: str
    group: str  # one of GROUPS
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


# Seed 000's table, in the order it is checked. Names are matched on whole
# dotted components, so "experts.w1.weight" and "layers.0.moe.experts.w1.weight"
# both match while "gate_proj.weight" (the dense SwiGLU gate) does not match "gate".
PARTITION_RULES: tuple[PartitionRule, ...] = (
    # Norm gains, biases, scalars (GDN A_log / dt_bias / D): no matrix to orthogonalise.
    PartitionRule("scalar_or_vector", "adamw_no_decay", lambda name, param: param.ndim < 2),
    # Routed and shared MoE experts: kept on AdamW so Muon's per-matrix
    # normalisation does not fight the gate-bias load balancing.
    PartitionRule("expert_weights", "adamw", _inside("experts", "shared_expert", "shared_experts")),
    # Stacked (3-D+) weights: Muon is a matrix optimizer.
    PartitionRule("tensor_3d_or_more", "adamw", lambda name, param: param.ndim > 2),
    # One row per token: orthogonalising would mix the tokens' identities.
    PartitionRule("embedding", "adamw", _owner_is("embed", "embedding", "embeddings", "tok_embeddings", "wte")),
    PartitionRule("output_head", "adamw", _owner_is("head", "lm_head", "output")),
    # Router / MoE gate: a small routing signal, not a hidden transform.
    PartitionRule("router_gate", "adamw", _owner_is("gate", "router")),
    PartitionRule("hidden_matrix", "muon", lambda name, param: param.ndim == 2),
)


@dataclass(frozen=True)
class ParamAssignment:
    name: str
    shape: tuple[int, ...]
    group: str
    rule: str


def partition_parameters(
    named_parameters: Iterable[tuple[str, nn.Parameter]],
    rules: tuple[PartitionRule, ...] = PARTITION_RULES,
) -> list[tuple[ParamAssignment, nn.Parameter]]:
    """Assign each trainable parameter to a group by the first matching rule."""
    assigned = []
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        rule = next((r for r in rules if r.matches(name, param)), None)
        if rule is None:
            raise ValueError(f"no partition rule matches parameter {name} {tuple(param.shape)}")
        assigned.append((ParamAssignment(name, tuple(param.shape), rule.group, rule.name), param))
    return assigned


# ---------------------------------------------------------------- Newton-Schulz


def newton_schulz(
    g_AB: torch.Tensor,
    steps: int = 5,
    coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
    eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Approximate U V^T of g = U S V^T with the quintic X <- aX + (bA + cA^2)X, A = XX^T.

    Works on the wide orientation (fewer rows than columns) so the Gram matrix
    is the small one. Frobenius normalisation first bounds the spectral norm
    by 1, inside the iteration's basin. Returns `dtype`.
    """
    a, b, c = coefficients
    transposed = g_AB.size(0) > g_AB.size(1)
    x = g_AB.to(dtype)
    if transposed:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        polynomial = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, polynomial, x, beta=a)
    return x.T if transposed else x


def muon_lr_scale(shape: tuple[int, ...], adjustment: str) -> float:
    A, B = shape[:2]
    if adjustment == "match_rms_adamw":  # Moonlight: RMS of the update ~= AdamW's
        return 0.2 * math.sqrt(max(A, B))
    if adjustment == "original":  # Keller Jordan's sqrt(max(1, rows/cols))
        return math.sqrt(max(1.0, A / B))
    return 1.0


def _orthogonalise(update: torch.Tensor, group: dict) -> torch.Tensor:
    ns = lambda m: newton_schulz(  # noqa: E731
        m, group["ns_steps"], tuple(group["ns_coefficients"]), group["ns_eps"], NS_DTYPES[group["ns_dtype"]]
    )
    if DTensor is not None and isinstance(update, DTensor):
        # Never orthogonalise a shard: gather the whole matrix (as Moonlight/torchtitan do),
        # orthogonalise it on every rank (same input, same result), keep this rank's rows.
        full = ns(update.full_tensor()).to(update.dtype)
        return distribute_tensor(full, update.device_mesh, update.placements, src_data_rank=None)
    return ns(update).to(update.dtype)


# ---------------------------------------------------------------- the optimizer


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 3e-4  # AdamW-scale; Muon shares it through the RMS matching
    weight_decay: float = 0.1  # on matrices only; norms/biases/scalars get 0
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    muon_momentum: float = 0.95
    muon_nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    ns_eps: float = 1e-7
    ns_dtype: str = "bfloat16"  # bfloat16 | float32 | float64
    muon_lr_adjustment: str = "match_rms_adamw"
    cautious_weight_decay: bool = False

    def __post_init__(self) -> None:
        if self.ns_dtype not in NS_DTYPES:
            raise ValueError(f"ns_dtype must be one of {tuple(NS_DTYPES)}, got {self.ns_dtype!r}")
        if self.muon_lr_adjustment not in MUON_LR_ADJUSTMENTS:
            raise ValueError(f"muon_lr_adjustment must be one of {MUON_LR_ADJUSTMENTS}")
        if self.lr < 0 or self.weight_decay < 0:
            raise ValueError("lr and weight_decay must be >= 0")


class PartitionedOptimizer(torch.optim.Optimizer):
    """What the trainer and checkpoints need from a by-name partitioned optimizer.

    Groups carry `group` (their partition name), `param_names` and `lr_scale`:
    the trainer sets one scheduled LR and each group takes `lr * lr_scale`, so
    groups with separate peak LRs still follow one schedule.
    """

    def layout(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(group, parameter name, shape) for every parameter, in state_dict order."""
        return [
            (group["group"], name, tuple(param.shape))
            for group in self.param_groups
            for name, param in zip(group["param_names"], group["params"])
        ]

    def set_learning_rate(self, lr: float) -> None:
        for group in self.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

    def load_state_dict(self, state_dict: dict) -> None:
        """Refuse optimizer state whose groups or parameter names differ from ours."""
        saved = [(g.get("group"), g.get("param_names")) for g in state_dict["param_groups"]]
        ours = [(g["group"], g["param_names"]) for g in self.param_groups]
        if saved != ours:
            raise ValueError("optimizer state does not match this model's parameter layout")
        super().load_state_dict(state_dict)


class MuonAdamW(PartitionedOptimizer):
    """Groups carry `algorithm` ("muon" | "adamw") and `param_names`."""

    def __init__(self, named_parameters: Iterable[tuple[str, nn.Parameter]], config: OptimizerConfig = OptimizerConfig()):
        self.config = config
        assigned = partition_parameters(named_parameters)
        self.assignments = [assignment for assignment, _ in assigned]
        groups = []
        for group_name in GROUPS:
            members = [(a.name, p) for a, p in assigned if a.group == group_name]
            if not members:
                continue
            group = {
                "params": members,
                "group": group_name,
                "algorithm": "muon" if group_name == "muon" else "adamw",
                "weight_decay": 0.0 if group_name == "adamw_no_decay" else config.weight_decay,
            }
            if group_name == "muon":
                group.update(
                    momentum=config.muon_momentum,
                    nesterov=config.muon_nesterov,
                    ns_steps=config.ns_steps,
                    ns_coefficients=config.ns_coefficients,
                    ns_eps=config.ns_eps,
                    ns_dtype=config.ns_dtype,
                    lr_adjustment=config.muon_lr_adjustment,
                )
            else:
                group.update(betas=config.adamw_betas, eps=config.adamw_eps)
            groups.append(group)
        defaults = {"lr": config.lr, "cautious_weight_decay": config.cautious_weight_decay}
        super().__init__(groups, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["algorithm"] == "muon":
                self._muon_step(group)
            else:
                self._adamw_step(group)
        return loss

    def _decay(self, param: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        factor = group["lr"] * group["weight_decay"]
        if factor == 0.0:
            return
        if group["cautious_weight_decay"]:
            # param -= lr*wd*param only where the update (subtracted) shares param's sign.
            param.mul_(1.0 - factor * (update * param > 0).to(param.dtype))
        else:
            param.mul_(1.0 - factor)

    def _muon_step(self, group: dict) -> None:
        momentum = group["momentum"]
        for param in group["params"]:
            if param.grad is None:
                continue
            grad = param.grad
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            buffer = state["momentum_buffer"]
            buffer.lerp_(grad, 1.0 - momentum)
            update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
            direction = _orthogonalise(update, group)
            self._decay(param, direction, group)
            scale = muon_lr_scale(tuple(param.shape), group["lr_adjustment"])
            param.add_(direction, alpha=-group["lr"] * scale)

    def _adamw_step(self, group: dict) -> None:
        for param in group["params"]:
            if param.grad is None:
                continue
            exp_avg, denominator, bias_correction = adam_moments_(self.state[param], param.grad, param, group)
            # sign(update) == sign(exp_avg), which is all cautious decay needs.
            self._decay(param, exp_avg, group)
            param.addcdiv_(exp_avg, denominator, value=-group["lr"] / bias_correction)


def adam_moments_(state: dict, grad: torch.Tensor, like: torch.Tensor, group: dict) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Advance AdamW's moments in `state`; returns (exp_avg, bias-corrected denominator, 1 - beta1^t)."""
    beta1, beta2 = group["betas"]
    if "step" not in state:
        # Step count on the CPU, as torch.optim.AdamW keeps it: no device sync to read it.
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(like, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(like, memory_format=torch.preserve_format)
    state["step"] += 1
    step = state["step"].item()
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    exp_avg.lerp_(grad, 1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    denominator = (exp_avg_sq.sqrt() / (1.0 - beta2**step) ** 0.5).add_(group["eps"])
    return exp_avg, denominator, 1.0 - beta1**step


# ---------------------------------------------------------------- NorMuon + CautiousAdamW (seed 000 §2-3)
#
# The seed's dual optimizer: NorMuon on the dense 2-D hidden matrices, CautiousAdamW on everything
# else, split by parameter name. One torch optimizer object holds both (one step, one state_dict, one
# GradScaler unscale_), with a separate peak LR per side through the groups' `lr_scale`.


def _endswith(*suffixes: str) -> Callable[[str, torch.Tensor], bool]:
    return lambda name, param: name.endswith(suffixes)


# The seed's dense matrices, by the name of the module that owns them: GQA attention, MLA, GDN,
# the dense SwiGLU, and MTP's [hidden; embedding] -> d projection.
DENSE_MATRIX_MODULES = frozenset({
    "q_proj", "k_proj", "v_proj", "o_proj",
    "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "wq", "wk", "wv", "wo",
    "in_proj", "out_proj", "a_proj", "b_proj", "g_proj",  # GDN: its in_proj split by output (fla's names)
    "gate_proj", "up_proj", "down_proj",
    "proj",
})
UNNAMED_MATRIX_RULE = "unnamed_matrix"  # the seed's fall-through to NorMuon; the golden test refuses it
NORMUON_GROUPS = ("normuon", "adamw_embed_head", "adamw")

# Seed 000 §2.1, goes_to_adamw, one row per condition (suffix matches, as the seed's string rule).
# Our embedding and head are `tok_embeddings` / `output`; both spellings are listed so the names
# (and every existing checkpoint) stay as they are.
NORMUON_PARTITION_RULES: tuple[PartitionRule, ...] = (
    PartitionRule("embedding", "adamw_embed_head", _endswith("embed.weight", "tok_embeddings.weight")),
    PartitionRule("output_head", "adamw_embed_head", _endswith("head.weight", "output.weight")),
    PartitionRule("moe_gate", "adamw", _endswith(".gate.weight", ".gate.bias")),
    PartitionRule("routed_experts", "adamw", _endswith(".experts.w1.weight", ".experts.w2.weight", ".experts.w3.weight")),
    PartitionRule("shared_expert", "adamw", _endswith(".shared_expert.w1.weight", ".shared_expert.w2.weight",
                                                       ".shared_expert.w3.weight")),
    PartitionRule("gdn_scalars", "adamw", _endswith(".A_log", ".dt_bias", ".D")),
    PartitionRule("norm_gain", "adamw", _endswith("norm.weight")),
    PartitionRule("vector", "adamw", lambda name, param: param.ndim < 2),
    PartitionRule("tensor_3d_or_more", "adamw", lambda name, param: param.ndim > 2),
    PartitionRule("dense_matrix", "normuon",
                  lambda name, param: param.ndim == 2 and _owner_is(*DENSE_MATRIX_MODULES)(name, param)),
    PartitionRule(UNNAMED_MATRIX_RULE, "normuon", lambda name, param: param.ndim == 2),
)


def newton_schulz_batched(
    g_NAB: torch.Tensor,
    steps: int = 5,
    coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
    eps: float = 1e-7,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Newton-Schulz on a stack of same-shape matrices: one bmm chain instead of a loop per matrix.

    `newton_schulz` above stays the per-matrix form: MuonAdamW is held bit for bit to
    torch.optim.Muon, whose addmm chain a bmm does not reproduce exactly.

    X <- aX + (bA + cA^2)X with A = XX^T, from each matrix's Frobenius-normalised start. The
    default is Muon's quintic; (1.5, -0.5, 0.0) is seed 000 §3.1's cubic X <- 1.5X - 0.5XX^TX.
    Tall stacks are transposed so the Gram matrix is the small one. Returns `dtype`.
    """
    a, b, c = coefficients
    x_NAB = g_NAB.to(dtype)
    tall = x_NAB.size(-2) > x_NAB.size(-1)
    if tall:
        x_NAB = x_NAB.mT
    x_NAB = x_NAB / x_NAB.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram_NAA = x_NAB @ x_NAB.mT
        polynomial_NAA = torch.baddbmm(gram_NAA, gram_NAA, gram_NAA, beta=b, alpha=c)
        x_NAB = torch.baddbmm(x_NAB, polynomial_NAA, x_NAB, beta=a)
    return x_NAB.mT if tall else x_NAB


def cautious_mask(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """1 where decay agrees with the gradient (grad * param > 0: descending shrinks |param|), else 0."""
    return (grad * param > 0).to(param.dtype)


NORMUON_UPDATE_SCALES = ("match_rms_adamw", "momentum_norm")


@dataclass(frozen=True)
class NorMuonConfig:
    """Seed 000 §3.2-3.5. `lr` is CautiousAdamW's peak LR, `muon_lr` NorMuon's (one schedule scales both)."""

    lr: float = 3e-4
    muon_lr: float = 3e-4  # same scale as AdamW because the update's RMS is matched to AdamW's (0.2)
    muon_momentum: float = 0.95  # Polyak (heavy-ball): m <- mu m + g
    muon_weight_decay: float = 0.1
    row_normalisation: bool = True  # the published NorMuon's per-neuron second moment (docs/training.md)
    row_beta2: float = 0.95
    row_eps: float = 1e-8
    update_scale: str = "match_rms_adamw"  # or "momentum_norm": seed 000 §3.1 restores ||m||_F
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    ns_eps: float = 1e-7
    ns_dtype: str = "float32"
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    adamw_weight_decay: float = 0.0  # seed 000 §3.3: no decay on norms, scalars, gates, experts ...
    embed_weight_decay: float = 0.1  # ... and 0.1 on the embedding and the output head
    cautious_weight_decay: bool = True

    def __post_init__(self) -> None:
        if self.ns_dtype not in NS_DTYPES:
            raise ValueError(f"ns_dtype must be one of {tuple(NS_DTYPES)}, got {self.ns_dtype!r}")
        if self.update_scale not in NORMUON_UPDATE_SCALES:
            raise ValueError(f"update_scale must be one of {NORMUON_UPDATE_SCALES}, got {self.update_scale!r}")
        if min(self.lr, self.muon_lr, self.muon_weight_decay, self.adamw_weight_decay, self.embed_weight_decay) < 0:
            raise ValueError("learning rates and weight decays must be >= 0")
        if not (0 <= self.muon_momentum < 1 and 0 <= self.row_beta2 < 1 and all(0 <= b < 1 for b in self.adamw_betas)):
            raise ValueError("momentum and betas must lie in [0, 1)")


class NorMuonAdamW(PartitionedOptimizer):
    """NorMuon (group "normuon") + CautiousAdamW ("adamw_embed_head", "adamw") over one partition.

    NorMuon step for the parameters of one shape, all at once (seed 000 §3.2 order):
    Polyak momentum -> cautious mask from grad * param -> Newton-Schulz on the stacked momenta ->
    optional per-row second-moment normalisation -> masked decoupled decay -> update scaled to
    the configured norm. Parameters that are not fp32 get an fp32 master copy in the state: the
    update happens there and is copied back (seed 000 §3.6).
    """

    def __init__(self, named_parameters: Iterable[tuple[str, nn.Parameter]], config: NorMuonConfig = NorMuonConfig()):
        self.config = config
        assigned = partition_parameters(named_parameters, NORMUON_PARTITION_RULES)
        self.assignments = [assignment for assignment, _ in assigned]
        decay = {"normuon": config.muon_weight_decay, "adamw_embed_head": config.embed_weight_decay,
                 "adamw": config.adamw_weight_decay}
        groups = []
        for group_name in NORMUON_GROUPS:
            members = [(a.name, p) for a, p in assigned if a.group == group_name]
            if not members:
                continue
            group = {"params": members, "group": group_name, "weight_decay": decay[group_name]}
            if group_name == "normuon":
                lr_scale = config.muon_lr / config.lr if config.lr > 0 else 0.0
                group.update(algorithm="normuon", lr_scale=lr_scale, lr=config.lr * lr_scale, momentum=config.muon_momentum,
                             row_normalisation=config.row_normalisation, row_beta2=config.row_beta2, row_eps=config.row_eps,
                             update_scale=config.update_scale, ns_steps=config.ns_steps,
                             ns_coefficients=config.ns_coefficients, ns_eps=config.ns_eps, ns_dtype=config.ns_dtype)
            else:
                group.update(algorithm="adamw", lr_scale=1.0, betas=config.adamw_betas, eps=config.adamw_eps)
            groups.append(group)
        super().__init__(groups, {"lr": config.lr, "cautious_weight_decay": config.cautious_weight_decay})

    def _master(self, param: torch.Tensor) -> torch.Tensor:
        """The fp32 tensor the update is applied to: the parameter itself when it is fp32 (or fp64)."""
        if param.dtype in (torch.float32, torch.float64):
            return param
        state = self.state[param]
        if "master" not in state:
            state["master"] = param.detach().float().clone()
        return state["master"]

    def _decay_(self, master: torch.Tensor, grad: torch.Tensor, group: dict) -> None:
        factor = group["lr"] * group["weight_decay"]
        if factor == 0.0:
            return
        if group["cautious_weight_decay"]:
            master.mul_(1.0 - factor * cautious_mask(grad, master))
        else:
            master.mul_(1.0 - factor)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["algorithm"] == "normuon":
                by_shape: dict[tuple[int, ...], list[torch.Tensor]] = {}
                for param in params:
                    by_shape.setdefault(tuple(param.shape), []).append(param)
                for same_shape in by_shape.values():
                    self._normuon_step(same_shape, group)
            else:
                for param in params:
                    self._cautious_adamw_step(param, group)
        return loss

    def _normuon_step(self, params: list[torch.Tensor], group: dict) -> None:
        masters = [self._master(p) for p in params]
        grads = [p.grad.to(m.dtype) for p, m in zip(params, masters)]
        momenta = []
        for param, master, grad in zip(params, masters, grads):
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(master, memory_format=torch.preserve_format)
            momenta.append(state["momentum_buffer"].mul_(group["momentum"]).add_(grad))
        directions = _orthogonalise_stack(momenta, group)
        if group["row_normalisation"]:
            # Published NorMuon: v <- b2 v + (1 - b2) mean_j O_ij^2 per row (neuron), O <- O / (sqrt(v) + eps).
            rows = []
            for param, direction in zip(params, directions):
                state = self.state[param]
                if "row_second_moment" not in state:
                    state["row_second_moment"] = direction.new_zeros(direction.shape[0])
                second = state["row_second_moment"]
                second.lerp_(direction.square().mean(dim=1), 1.0 - group["row_beta2"])
                rows.append(direction / (second.sqrt() + group["row_eps"]).unsqueeze(1))
            directions = rows
        for param, master, grad, momentum, direction in zip(params, masters, grads, momenta, directions):
            # Norms of whole matrices: under FSDP2 a shard's norm() is a partial sum until reduced.
            target = (0.2 * math.sqrt(direction.numel()) if group["update_scale"] == "match_rms_adamw"
                      else float(_whole(momentum.norm())))
            scale = target / max(float(_whole(direction.norm())), group["ns_eps"])
            self._decay_(master, grad, group)
            master.add_(direction.to(master.dtype), alpha=-group["lr"] * scale)
            if master is not param:
                param.copy_(master)

    def _cautious_adamw_step(self, param: torch.Tensor, group: dict) -> None:
        master = self._master(param)
        grad = param.grad.to(master.dtype)
        exp_avg, denominator, bias_correction = adam_moments_(self.state[param], grad, master, group)
        self._decay_(master, grad, group)
        master.addcdiv_(exp_avg, denominator, value=-group["lr"] / bias_correction)
        if master is not param:
            param.copy_(master)


def _whole(value: torch.Tensor) -> torch.Tensor:
    """A reduction over a DTensor shard completed over all ranks; plain tensors unchanged."""
    return value.full_tensor() if DTensor is not None and isinstance(value, DTensor) else value


def _orthogonalise_stack(momenta: list[torch.Tensor], group: dict) -> list[torch.Tensor]:
    """Newton-Schulz over same-shape momenta as one stack; FSDP2 shards are gathered whole first."""
    sharded = DTensor is not None and isinstance(momenta[0], DTensor)
    full = [m.full_tensor() for m in momenta] if sharded else momenta
    stacked_NAB = newton_schulz_batched(torch.stack(full), group["ns_steps"], tuple(group["ns_coefficients"]),
                                        group["ns_eps"], NS_DTYPES[group["ns_dtype"]]).to(full[0].dtype)
    directions = list(stacked_NAB.unbind(0))
    if sharded:
        # Every rank orthogonalised the same whole matrices: keep this rank's rows, no second communication.
        directions = [distribute_tensor(d, m.device_mesh, m.placements, src_data_rank=None) for d, m in zip(directions, momenta)]
    return directions


def build_optimizer(model: nn.Module, config: OptimizerConfig | NorMuonConfig = OptimizerConfig()) -> PartitionedOptimizer:
    """MuonAdamW for an OptimizerConfig, NorMuon + CautiousAdamW for a NorMuonConfig."""
    if isinstance(config, NorMuonConfig):
        return NorMuonAdamW(model.named_parameters(), config)
    return MuonAdamW(model.named_parameters(), config)

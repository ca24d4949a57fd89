"""The two optimizers, each one torch object: MuonAdamW and NorMuon + CautiousAdamW.

Which parameter goes to which side, and which parameters decay, is one table for both
(hymo_core/train/partition.py, seed 000 §2.1 and §3.3); each optimizer only names its groups.

Muon (Keller Jordan; Moonlight): Nesterov momentum, then the quintic
Newton-Schulz iteration (3.4445, -4.7750, 2.0315) x 5 pushes the update's
singular values towards 1. The update is rescaled by 0.2 sqrt(max(A, B)) so
its RMS matches AdamW's (~0.2); the AdamW learning rate and weight decay
therefore carry over to Muon groups unchanged, and one schedule drives all
groups. Newton-Schulz runs in bf16 by default (its purpose is a direction,
not precision); fp32/fp64 are available (seed 002: chosen independently of
the parameters' dtype).

Cautious weight decay: MuonAdamW follows Cautious Weight Decay (Chen et al.,
2025, `update_sign_mask`), NorMuon and CautiousAdamW follow seed 000 §3.2
(`gradient_sign_mask`). Off by default for MuonAdamW, which keeps its Muon
groups identical to `torch.optim.Muon(adjust_lr_fn="match_rms_adamw")` and
its AdamW groups to `torch.optim.AdamW(fused=True)` (its kernel, over all the group's tensors at
once); the tests hold both to that.

A single object means one `step`, one `zero_grad`, one `state_dict`, one LR
assignment, and one GradScaler `unscale_` for the whole model (seed 002).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.optim.adamw import adamw

from hymo_core.models.configs import ModelConfig
from hymo_core.planner.muon import newton_schulz_flops
from hymo_core.models.mup import adamw_lr_multiplier, muon_lr_multiplier, width_role
from hymo_core.train.partition import partition_parameters, weight_decay_for
from hymo_core.train.optim_config import NS_DTYPE_NAMES, NorMuonConfig, OptimizerConfig, resolve_ns_dtype

from hymo_core.train.owned_newton_schulz import local_part, orthogonalise_groups, rows_like, shard_group, sum_over_shards_

NS_DTYPES = {name: getattr(torch, name) for name in NS_DTYPE_NAMES}
# Each optimizer's group name for each partition kind (hymo_core/train/partition.py), in group order.
MUON_ADAMW_GROUPS = {"matrix": "muon", "embed_head": "adamw", "no_decay": "adamw_no_decay"}
NORMUON_GROUPS = {"matrix": "normuon", "embed_head": "adamw_embed_head", "no_decay": "adamw"}


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


def ns_dtype_of(group: dict, device: torch.device) -> torch.dtype:
    """The dtype a Muon / NorMuon group's Newton-Schulz runs in on `device` ("auto": bf16 on CUDA, fp32 elsewhere)."""
    return NS_DTYPES[resolve_ns_dtype(group["ns_dtype"], device)]


def _stack_function(group: dict, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """Newton-Schulz of a stack (N, A, B) with the group's settings: one bmm chain for the whole stack."""
    steps, coefficients, eps = group["ns_steps"], tuple(group["ns_coefficients"]), group["ns_eps"]
    return lambda x_NAB: newton_schulz_batched(x_NAB, steps, coefficients, eps, dtype)


def shape_groups(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Indices of same-shape tensors, in first-seen order: the unit every optimizer op works on at once."""
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_shape.setdefault(tuple(tensor.shape), []).append(index)
    return list(by_shape.values())


def orthogonalise(updates: list[torch.Tensor], layouts: list[torch.Tensor], group: dict) -> list[tuple[list[int], torch.Tensor]]:
    """Newton-Schulz of every update, per shape group: (indices, this rank's rows of their directions, stacked).

    `updates` are this rank's rows (plain tensors), `layouts` the parameters they belong to (DTensors
    under FSDP2). Never a shard's Newton-Schulz (it is not a shard of the matrix's): under FSDP2 with
    more than one rank each matrix is orthogonalised once, by the rank that owns it
    (hymo_core.train.owned_newton_schulz); a rank that holds the whole matrix works on it where it is.
    """
    order = shape_groups(layouts)
    dtype = ns_dtype_of(group, updates[0].device)
    stacks = orthogonalise_groups([[updates[i] for i in indices] for indices in order], [layouts[i[0]] for i in order],
                                  _stack_function(group, dtype), dtype)
    return list(zip(order, stacks))


@dataclass(frozen=True)
class NewtonSchulzCost:
    """What an optimizer's Newton-Schulz costs per update: every Muon / NorMuon matrix orthogonalised once
    (the whole model's figure; under FSDP's owned scheme each rank does its share, hymo_core/planner/muon.py)."""

    flops: int
    dtype: str  # as resolved on the parameters' device
    matrices: int

    def to_json(self) -> dict:
        return {"ns_flops": self.flops, "ns_dtype": self.dtype, "ns_matrices": self.matrices}


def newton_schulz_cost(optimizer: torch.optim.Optimizer) -> NewtonSchulzCost:
    """FLOPs and dtype of one update's Newton-Schulz, from the optimizer's own Muon / NorMuon groups (what an
    MFU row adds to the model's FLOPs). Counted with the planner's per-matrix rule on the wide orientation."""
    flops, matrices, dtypes = 0, 0, set()
    for group in optimizer.param_groups:
        if group.get("algorithm") not in ("muon", "normuon"):
            continue
        for param in group["params"]:
            flops += newton_schulz_flops(param.shape[0], param.shape[1], group["ns_steps"])
            matrices += 1
            dtypes.add(str(ns_dtype_of(group, param.device)).removeprefix("torch."))
    if len(dtypes) > 1:
        raise ValueError(f"the optimizer's Newton-Schulz groups resolve to different dtypes: {sorted(dtypes)}")
    return NewtonSchulzCost(flops, dtypes.pop() if dtypes else "none", matrices)


# ---------------------------------------------------------------- the optimizer


class PartitionedOptimizer(torch.optim.Optimizer):
    """What the trainer and checkpoints need from a by-name partitioned optimizer.

    Groups carry `group` (their partition name), `param_names` and `lr_scale`:
    the trainer sets one scheduled LR and each group takes `lr * lr_scale`, so
    groups with separate peak LRs still follow one schedule.
    """

    def _partition(self, named_parameters: Iterable[tuple[str, nn.Parameter]], group_names: dict[str, str],
                   matrix_decay: float, embed_head_decay: float, model_config: ModelConfig | None = None) -> list[tuple[str, dict]]:
        """(kind, group) for each kind that has parameters: members, group name and weight decay from the one table.

        Under muP (`model_config.parametrisation == "mup"`) each AdamW kind splits by width role: its hidden
        matrices (router gates, experts) form a group "<name>_mup_hidden" with `lr_scale` 1/m
        (hymo_core/models/mup.py); the matrix kind's muP factor depends on the update scale, so the
        optimizer sets it. Every group carries `lr_scale`.
        """
        assigned = partition_parameters(named_parameters, group_names)
        self.assignments = [assignment for assignment, _ in assigned]
        mup = model_config is not None and model_config.parametrisation == "mup"
        groups = []
        for kind, group_name in group_names.items():
            members = [(a.name, p) for a, p in assigned if a.kind == kind]
            by_scale: dict[float, list] = {}
            for name, param in members:
                scale = adamw_lr_multiplier(model_config, width_role(name, param.ndim)) if mup and kind != "matrix" else 1.0
                by_scale.setdefault(scale, []).append((name, param))
            for scale, scaled_members in sorted(by_scale.items(), reverse=True):
                groups.append((kind, {"params": scaled_members, "group": group_name if scale == 1.0 else f"{group_name}_mup_hidden",
                                      "lr_scale": scale, "weight_decay": weight_decay_for(kind, matrix_decay, embed_head_decay)}))
        return groups

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

    def __init__(self, named_parameters: Iterable[tuple[str, nn.Parameter]], config: OptimizerConfig = OptimizerConfig(),
                 model_config: ModelConfig | None = None):
        self.config = config
        groups = []
        for kind, group in self._partition(named_parameters, MUON_ADAMW_GROUPS, config.weight_decay, config.weight_decay,
                                           model_config):
            group["algorithm"] = "muon" if kind == "matrix" else "adamw"
            if kind == "matrix" and model_config is not None and model_config.parametrisation == "mup":
                group["lr_scale"] *= muon_lr_multiplier(model_config, config.muon_lr_adjustment)
            group["lr"] = config.lr * group["lr_scale"]
            if kind == "matrix":
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

    def _muon_step(self, group: dict) -> None:
        """All the group's matrices at once: foreach momentum, Newton-Schulz per shape, foreach decay and update."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        momentum = group["momentum"]
        for param in params:
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        # This rank's rows only (plain tensors): elementwise work needs no communication, and spares DTensor dispatch.
        locals_ = [local_part(p) for p in params]
        grads = [local_part(p.grad) for p in params]
        buffers = [local_part(self.state[p]["momentum_buffer"]) for p in params]
        torch._foreach_lerp_(buffers, grads, 1.0 - momentum)
        updates = torch._foreach_lerp(grads, buffers, momentum) if group["nesterov"] else buffers
        for indices, directions_NAB in orthogonalise(updates, params, group):
            chosen, directions = [locals_[i] for i in indices], list(directions_NAB.unbind(0))
            decay_(chosen, directions, group["lr"] * group["weight_decay"], group["cautious_weight_decay"])
            scale = muon_lr_scale(tuple(params[indices[0]].shape), group["lr_adjustment"])
            torch._foreach_add_(chosen, directions, alpha=-group["lr"] * scale)

    def _adamw_step(self, group: dict) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        if group["cautious_weight_decay"]:
            # sign(update) == sign(exp_avg after this step's lerp), which is all cautious decay needs.
            exp_avgs = [adamw_state(self.state[p], p)["exp_avg"] for p in params]
            decay_(params, torch._foreach_lerp(exp_avgs, grads, 1.0 - group["betas"][0]), group["lr"] * group["weight_decay"], True)
            fused_adamw_(params, grads, [self.state[p] for p in params], group, weight_decay=0.0)
        else:  # exactly torch.optim.AdamW(fused=True)
            fused_adamw_(params, grads, [self.state[p] for p in params], group, weight_decay=group["weight_decay"])


def adamw_state(state: dict, like: torch.Tensor) -> dict:
    """AdamW's moments and step count, created on first use; the step lives on the parameter's device
    (torch's fused kernel reads it there, so no host read is needed for the bias corrections)."""
    if "step" not in state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=like.device)
        state["exp_avg"] = torch.zeros_like(like, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(like, memory_format=torch.preserve_format)
    elif state["step"].device != like.device:  # a checkpoint written by the per-parameter loop kept it on the CPU
        state["step"] = state["step"].to(device=like.device, dtype=torch.float32)
    return state


def fused_adamw_(params: list[torch.Tensor], grads: list[torch.Tensor], states: list[dict], group: dict,
                 weight_decay: float) -> None:
    """One AdamW step over lists with torch's fused kernel (CPU and CUDA): no Python loop per tensor
    on the device, no host read. `weight_decay` is torch's decoupled decay (0 when decay is cautious)."""
    states = [adamw_state(state, param) for state, param in zip(states, params)]
    beta1, beta2 = group["betas"]
    adamw(params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
          [s["step"] for s in states], fused=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
          weight_decay=weight_decay, eps=group["eps"], maximize=False)


def cautious_factors(signal: list[torch.Tensor], params: list[torch.Tensor], factor: float) -> list[torch.Tensor]:
    """1 - factor * [signal * param > 0] for each tensor, with foreach ops (sign, then clamp to {0, 1})."""
    masks = torch._foreach_mul(signal, params)
    torch._foreach_sign_(masks)
    torch._foreach_clamp_min_(masks, 0.0)
    torch._foreach_mul_(masks, -factor)
    torch._foreach_add_(masks, 1.0)
    return masks


def decay_(params: list[torch.Tensor], signal: list[torch.Tensor], factor: float, cautious: bool) -> None:
    """Decoupled decay by `factor` (= lr * wd); cautious: only where `signal` (the update's direction
    or the gradient) shares the parameter's sign, so decay never fights the step."""
    if factor == 0.0:
        return
    # Elementwise, so each rank's shard alone (FSDP2 shards a parameter and its signal alike); plain tensors
    # also spare DTensor dispatch, which has no sharding rule for _foreach_sign_ in torch 2.11 (the H200's).
    params, signal = [local_part(p) for p in params], [local_part(s) for s in signal]
    if cautious:
        torch._foreach_mul_(params, cautious_factors(signal, params, factor))
    else:
        torch._foreach_mul_(params, 1.0 - factor)


# ---------------------------------------------------------------- NorMuon + CautiousAdamW (seed 000 §2-3)
#
# The seed's dual optimizer: NorMuon on the dense 2-D hidden matrices, CautiousAdamW on everything
# else, split by parameter name. One torch optimizer object holds both (one step, one state_dict, one
# GradScaler unscale_), with a separate peak LR per side through the groups' `lr_scale`.


def newton_schulz_batched(
    g_NAB: torch.Tensor,
    steps: int = 5,
    coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
    eps: float = 1e-7,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Newton-Schulz on a stack of same-shape matrices: one bmm chain instead of a loop per matrix.

    Both optimizers run it. `newton_schulz` above is the per-matrix form (torch.optim.Muon's addmm
    chain); on the CPU the two agree bit for bit (tests/hymo_core/train/test_optim.py holds MuonAdamW
    to torch.optim.Muon), on a GPU a batched GEMM may round differently from a single one.

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


# Cautious decay: decoupled weight decay applied only to the coordinates it does not fight. Each
# optimizer has one meaning of it, named after where it comes from.


def update_sign_mask(update: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """MuonAdamW's: Cautious Weight Decay (Chen et al., 2025): decay where the optimizer's update and
    the parameter share a sign (the update is subtracted, so it already moves the parameter towards 0)."""
    return (update * param > 0).to(param.dtype)


def gradient_sign_mask(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """NorMuon's and CautiousAdamW's: seed 000 §3.2: decay where grad * param > 0, i.e. where descending
    the gradient already shrinks |param|."""
    return (grad * param > 0).to(param.dtype)




class NorMuonAdamW(PartitionedOptimizer):
    """NorMuon (group "normuon") + CautiousAdamW ("adamw_embed_head", "adamw") over one partition.

    NorMuon step for the parameters of one shape, all at once (seed 000 §3.2 order):
    Polyak momentum -> cautious mask from grad * param -> Newton-Schulz on the stacked momenta ->
    optional per-row second-moment normalisation -> masked decoupled decay -> update scaled to
    the configured norm. Parameters that are not fp32 get an fp32 master copy in the state: the
    update happens there and is copied back (seed 000 §3.6).
    """

    def __init__(self, named_parameters: Iterable[tuple[str, nn.Parameter]], config: NorMuonConfig = NorMuonConfig(),
                 model_config: ModelConfig | None = None):
        self.config = config
        groups = []
        for kind, group in self._partition(named_parameters, NORMUON_GROUPS, config.muon_weight_decay, config.embed_weight_decay,
                                           model_config):
            if kind == "matrix":
                lr_scale = config.muon_lr / config.lr if config.lr > 0 else 0.0
                if model_config is not None and model_config.parametrisation == "mup":
                    lr_scale *= muon_lr_multiplier(model_config, config.update_scale)
                group.update(algorithm="normuon", lr_scale=lr_scale, lr=config.lr * lr_scale, momentum=config.muon_momentum,
                             row_normalisation=config.row_normalisation, row_beta2=config.row_beta2, row_eps=config.row_eps,
                             update_scale=config.update_scale, ns_steps=config.ns_steps,
                             ns_coefficients=config.ns_coefficients, ns_eps=config.ns_eps, ns_dtype=config.ns_dtype)
            else:
                group.update(algorithm="adamw", lr=config.lr * group["lr_scale"], betas=config.adamw_betas, eps=config.adamw_eps)
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

    def _decay_(self, masters: list[torch.Tensor], grads: list[torch.Tensor], group: dict) -> None:
        decay_(masters, grads, group["lr"] * group["weight_decay"], group["cautious_weight_decay"])

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["algorithm"] == "normuon":
                if params:
                    self._normuon_step(params, group)
            elif params:
                self._cautious_adamw_step(params, group)
        return loss

    def _normuon_step(self, params: list[torch.Tensor], group: dict) -> None:
        """Every NorMuon matrix of the group at once: foreach ops over the group, one stack per shape for
        Newton-Schulz, the row statistics and the update, one norm reduction (and all-reduce) for all.

        A launch count that does not grow with the number of matrices (tests/hymo_core/train/
        test_optimizer_launches.py); per-element arithmetic as the per-matrix form had it.
        """
        masters = [self._master(p) for p in params]
        for param, master in zip(params, masters):
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(master, memory_format=torch.preserve_format)
            if group["row_normalisation"] and "row_second_moment" not in state:
                state["row_second_moment"] = rows_like(state["momentum_buffer"])
        # From here on this rank's rows only (plain tensors): FSDP2 shards by row, so rows are whole on
        # every rank; the per-row work needs no communication and the norms one all-reduce for all matrices.
        local_masters = [local_part(m) for m in masters]
        grads = [local_part(p.grad).to(m.dtype) for p, m in zip(params, local_masters)]
        momenta = [local_part(self.state[p]["momentum_buffer"]) for p in params]
        torch._foreach_mul_(momenta, group["momentum"])
        torch._foreach_add_(momenta, grads)
        stacks = []
        for indices, directions_NAB in orthogonalise(momenta, params, group):
            directions_NAB = directions_NAB.to(local_masters[indices[0]].dtype)
            if group["row_normalisation"]:
                # Published NorMuon: v <- b2 v + (1 - b2) mean_j O_ij^2 per row (neuron), O <- O / (sqrt(v) + eps).
                seconds = [local_part(self.state[params[i]]["row_second_moment"]) for i in indices]
                torch._foreach_lerp_(seconds, list(directions_NAB.square().mean(dim=2).unbind(0)), 1.0 - group["row_beta2"])
                directions_NAB = directions_NAB / (torch.stack(seconds).sqrt() + group["row_eps"]).unsqueeze(2)
            stacks.append((indices, directions_NAB))
        scales = self._update_scales(momenta, stacks, group, shard_group(masters[0]))
        self._decay_(local_masters, grads, group)
        for (indices, directions_NAB), scale_N in zip(stacks, scales):
            # The scale stays on the device: no host read per matrix.
            factor = 0.2 * math.sqrt(params[indices[0]].numel()) if group["update_scale"] == "match_rms_adamw" else 1.0
            # (value * direction) * scale, then added: addcmul's order of operations, batched
            steps_NAB = (directions_NAB * (-group["lr"] * factor)).mul_(scale_N.view(-1, 1, 1))
            torch._foreach_add_([local_masters[i] for i in indices], list(steps_NAB.unbind(0)))
        self._copy_back(params, masters)

    @staticmethod
    def _update_scales(momenta: list[torch.Tensor], stacks: list[tuple[list[int], torch.Tensor]], group: dict,
                       shards: "torch.distributed.ProcessGroup | None") -> list[torch.Tensor]:
        """1 / ||direction||_F per matrix (times ||momentum||_F for "momentum_norm"), norms of whole matrices,
        one vector per shape group.

        Each rank sums the squares of its rows; one all-reduce over the shard group serves every matrix.
        """
        by_momentum = group["update_scale"] == "momentum_norm"
        squares = [directions_NAB.square().sum(dim=(1, 2)) for _, directions_NAB in stacks]
        if by_momentum:
            squares += [torch.stack([momenta[i] for i in indices]).square().sum(dim=(1, 2)) for indices, _ in stacks]
        norms = sum_over_shards_(torch.cat(squares), shards).sqrt()
        count = sum(len(indices) for indices, _ in stacks)
        inverse = 1.0 / norms[:count].clamp(min=group["ns_eps"])
        scales = norms[count:] * inverse if by_momentum else inverse
        return list(scales.split([len(indices) for indices, _ in stacks]))

    def _cautious_adamw_step(self, params: list[torch.Tensor], group: dict) -> None:
        masters = [self._master(p) for p in params]
        grads = [p.grad.to(m.dtype) for p, m in zip(params, masters)]
        self._decay_(masters, grads, group)
        fused_adamw_(masters, grads, [self.state[p] for p in params], group, weight_decay=0.0)
        self._copy_back(params, masters)

    @staticmethod
    def _copy_back(params: list[torch.Tensor], masters: list[torch.Tensor]) -> None:
        pairs = [(p, m) for p, m in zip(params, masters) if m is not p]
        if pairs:
            torch._foreach_copy_([p for p, _ in pairs], [m for _, m in pairs])


def build_optimizer(model: nn.Module, config: OptimizerConfig | NorMuonConfig = OptimizerConfig()) -> PartitionedOptimizer:
    """MuonAdamW for an OptimizerConfig, NorMuon + CautiousAdamW for a NorMuonConfig; a muP model's
    per-role LR factors come from its config."""
    model_config = getattr(model, "config", None)
    model_config = model_config if isinstance(model_config, ModelConfig) else None
    if isinstance(config, NorMuonConfig):
        return NorMuonAdamW(model.named_parameters(), config, model_config)
    return MuonAdamW(model.named_parameters(), config, model_config)

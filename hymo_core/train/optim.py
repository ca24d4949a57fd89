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
its AdamW groups to `torch.optim.AdamW`; the tests hold both to that.

A single object means one `step`, one `zero_grad`, one `state_dict`, one LR
assignment, and one GradScaler `unscale_` for the whole model (seed 002).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn

from hymo_core.train.partition import partition_parameters, weight_decay_for
from hymo_core.train.optim_config import NS_DTYPE_NAMES, NorMuonConfig, OptimizerConfig

try:  # FSDP2 shards parameters as DTensors; Newton-Schulz needs the whole matrix.
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None

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


class PartitionedOptimizer(torch.optim.Optimizer):
    """What the trainer and checkpoints need from a by-name partitioned optimizer.

    Groups carry `group` (their partition name), `param_names` and `lr_scale`:
    the trainer sets one scheduled LR and each group takes `lr * lr_scale`, so
    groups with separate peak LRs still follow one schedule.
    """

    def _partition(self, named_parameters: Iterable[tuple[str, nn.Parameter]], group_names: dict[str, str],
                   matrix_decay: float, embed_head_decay: float) -> list[tuple[str, dict]]:
        """(kind, group) for each kind that has parameters: members, group name and weight decay from the one table."""
        assigned = partition_parameters(named_parameters, group_names)
        self.assignments = [assignment for assignment, _ in assigned]
        groups = []
        for kind, group_name in group_names.items():
            members = [(a.name, p) for a, p in assigned if a.kind == kind]
            if members:
                groups.append((kind, {"params": members, "group": group_name,
                                      "weight_decay": weight_decay_for(kind, matrix_decay, embed_head_decay)}))
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

    def __init__(self, named_parameters: Iterable[tuple[str, nn.Parameter]], config: OptimizerConfig = OptimizerConfig()):
        self.config = config
        groups = []
        for kind, group in self._partition(named_parameters, MUON_ADAMW_GROUPS, config.weight_decay, config.weight_decay):
            group["algorithm"] = "muon" if kind == "matrix" else "adamw"
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

    def _decay(self, param: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        factor = group["lr"] * group["weight_decay"]
        if factor == 0.0:
            return
        if group["cautious_weight_decay"]:
            param.mul_(1.0 - factor * update_sign_mask(update, param))
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

    def __init__(self, named_parameters: Iterable[tuple[str, nn.Parameter]], config: NorMuonConfig = NorMuonConfig()):
        self.config = config
        groups = []
        for kind, group in self._partition(named_parameters, NORMUON_GROUPS, config.muon_weight_decay, config.embed_weight_decay):
            if kind == "matrix":
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
            master.mul_(1.0 - factor * gradient_sign_mask(grad, master))
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

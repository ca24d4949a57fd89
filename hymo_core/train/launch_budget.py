"""The kernel-launch budget of one training step at the preset shapes, counted on the meta device.

A small model's GPU step is mostly launches and host work (issue 53: dense-125m's optimizer alone launched
about 1,500 kernels for 84 matrices). The budget pins, per preset and phase, how many kernels one step may
launch; `tests/hymo_core/train/test_launch_budget.py` counts the step and fails when a change goes over it,
and `bench/launch_budget.py` prints the counts of this tree beside a parent commit's (docs/benchmarks.md).

The step is the trainer's: forward to the loss, backward, the global-norm clip
(`hymo_core.distributed.process_group.clip_grad_norm_`), the preset's optimizer (NorMuon + CautiousAdamW,
Newton-Schulz in bf16 as on CUDA). Counted on the meta device (no memory, any size): no autocast there, so
the bf16 casts autocast adds on a GPU are not in the forward and backward figures. The hybrid presets' forward
reads routing counts on the host (MoE), which the meta device cannot; they are budgeted for the optimizer.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch

from hymo_core.models.configs import ModelConfig
from hymo_core.train.launch_count import LaunchCounter

PHASES = ("forward", "backward", "clip", "optimizer")

# (batch, seq_len) each preset's step is counted at: bench/gpu_check.py's rows.
BUDGET_SHAPES: dict[str, tuple[int, int]] = {"dense-125m": (8, 2048), "hymo-tiny": (8, 64), "hymo-750m": (2, 4096)}
MODEL_PHASES: dict[str, tuple[str, ...]] = {"dense-125m": PHASES, "hymo-tiny": ("optimizer",), "hymo-750m": ("optimizer",)}

# The one place the limits live: most launches a phase of one step may make, per preset. The lead (or the
# change that cuts launches) lowers these; a change that adds launches must raise them on purpose.
LAUNCH_BUDGET: dict[str, dict[str, int]] = {
    # forward 163 -> 195: the fused head + loss computes its gradient in the forward (backward 273 -> 223);
    # backward 223 -> 198: RMSNorm's unused rstd gets no zero-filled gradient (issue 54).
    "dense-125m": {"forward": 195, "backward": 198, "clip": 12, "optimizer": 132},
    "hymo-tiny": {"optimizer": 290},  # GDN's gate projections went to AdamW (issue 54): fewer NorMuon groups
    "hymo-750m": {"optimizer": 373},
}

# What a logging step (every log_interval updates: the weights' snapshot, the fp64 update ratios, the record)
# launches beyond an ordinary update, counted on the CPU through the trainer's own loop at tiny widths
# (bench/trainer_step.py logging_step_launches: the sample dense model and hymo-tiny, 2 x 32 tokens, 2 micro-batches).
LOGGING_BUDGET: dict[str, int] = {"sample-dense": 37, "hymo-tiny": 49}


@dataclass(frozen=True)
class StepCount:
    """Launches per phase of one step, and their sum."""

    model: str
    batch: int
    seq_len: int
    launches: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.launches.values())


def optimizer_config():
    """The presets' optimizer (PRESET_TRAINING: NorMuon + CautiousAdamW, cautious decay), Newton-Schulz in bf16
    as "auto" resolves on CUDA."""
    from hymo_core.train.optim_config import NorMuonConfig

    return NorMuonConfig(lr=1e-4, muon_lr=1e-4, cautious_weight_decay=True, ns_dtype="bfloat16")


@contextlib.contextmanager
def meta_takes_foreach():
    """torch's clip takes its foreach path on the meta device, as it does on CUDA (it falls back to a loop of two
    launches per parameter on devices it does not list, and meta is not listed)."""
    import torch.nn.utils.clip_grad as clip_grad
    import torch.utils._foreach_utils as foreach_utils

    modules = (clip_grad, foreach_utils)
    original = foreach_utils._device_has_foreach_support
    for module in modules:
        module._device_has_foreach_support = lambda device: device.type == "meta" or original(device)
    try:
        yield
    finally:
        for module in modules:
            module._device_has_foreach_support = original


def count_step(name: str, config: ModelConfig, batch: int, seq_len: int, phases: tuple[str, ...] = PHASES) -> StepCount:
    """Launches of one training step (the second: the first also creates the optimizer state) on the meta device."""
    from hymo_core.distributed.process_group import clip_grad_norm_
    from hymo_core.models.init import build_on_meta
    from hymo_core.train.optim import build_optimizer

    model = build_on_meta(replace(config, max_seq_len=max(config.max_seq_len, seq_len)), seed=0)
    model.train()
    optimizer = build_optimizer(model, optimizer_config())
    tokens = torch.zeros(batch, seq_len, dtype=torch.long, device="meta")
    counted: dict[str, int] = {}
    for step in range(2):
        counter = LaunchCounter()
        with counter, meta_takes_foreach():
            if "forward" in phases:
                with counter.phase("forward"):
                    _, loss = model(tokens, tokens)
                with counter.phase("backward"):
                    loss.backward()
            else:
                for param in model.parameters():
                    param.grad = torch.empty_like(param)
            if "clip" in phases:
                with counter.phase("clip"):
                    clip_grad_norm_(model.parameters(), 1.0)
            with counter.phase("optimizer"):
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        counted = {phase: counter.launches(phase) for phase in phases}
    return StepCount(name, batch, seq_len, counted)


def count_presets() -> list[StepCount]:
    """Every budgeted preset's step, at its budget shape."""
    from hymo_core.models.presets import PRESETS

    return [count_step(name, PRESETS[name], *BUDGET_SHAPES[name], MODEL_PHASES[name]) for name in LAUNCH_BUDGET]

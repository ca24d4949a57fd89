"""The kernel and byte budget of one forward + backward, per block kind, at a preset's real shapes (meta device).

A hybrid step's missing GPU time is mostly the small kernels around the matmuls. This module counts them
(hymo_core/train/launch_count.py's rules) for each unit the model repeats, so a regression in one block
kind shows in that kind's row, and `BUDGET` holds the limits the test (tests/hymo_core/train/
test_block_budget.py) and the table (bench/block_budget.py, docs/benchmarks.md) read:

* gdn / mla: one mixer (Gated DeltaNet, MLA) on its normed input;
* ffn / moe: one feed-forward (dense SwiGLU; DeepSeekMoE with its routing and dispatch);
* mtp: the whole multi-token-prediction loss (every depth: projection, block, head, cross-entropy);
* rest: the whole model's count less the units times their number in the model (embedding, the
  blocks' norms and residual adds, the main head and its loss).

Counted as the GPU would run the trainer's forward: weights in bf16 (autocast's per-step weight casts are
not counted), MoE experts in the "grouped" layout (`torch._grouped_mm`, sm_90+ in bf16), SDPA as the flash
kernel, the attention probe off (QK-Clip's own launches are counted by its test). Each unit's backward is
`autograd.backward` from an upstream gradient made outside the count, so its launches are the unit's own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hymo_core.train.launch_count import LaunchCounter

# Per unit: (most launches, forward + backward, and most bytes read + written) at hymo-750m, 2 x 4096.
BUDGET_PRESET, BUDGET_BATCH, BUDGET_SEQ = "hymo-750m", 2, 4096
# bench/block_budget.py prints the counts these were set from (docs/benchmarks.md, "Block budget").
BUDGET: dict[str, tuple[int, int]] = {
    "gdn": (18, 1_600_000_000),  # conv + norms and the gates one op each way (issue 54: was 70 / 4.25 GB)
    "mla": (32, 980_000_000),  # RMSNorm's unused rstd gets no zero-filled gradient (kernels/norm.py)
    "ffn": (9, 790_000_000),
    "moe": (30, 2_474_000_000),  # routing (the router's matmul inside) and dispatch in four fused ops
    # (kernels/moe_dispatch.py): was 88 / 3.47 GB in aten ops, 32 / 2.474 GB with the router a separate GEMM
    "mtp": (194, 24_950_000_000),  # each depth's head fused into its loss (kernels/linear_cross_entropy.py)
    "rest": (293, 20_750_000_000),  # the main head's fused loss computes its gradient in the forward
    "model": (1_631, 130_250_000_000),  # GDN inputs and MoE dispatch fused (issue 54): 3,438 on ce7dd1a
}


@dataclass
class UnitCount:
    name: str
    per_model: int  # how many times the model runs this unit a step
    forward: int  # launches
    backward: int
    bytes_moved: int  # read + written, forward and backward

    @property
    def launches(self) -> int:
        return self.forward + self.backward


def _count(run, upstream) -> tuple[int, int, int]:
    """(forward launches, backward launches, bytes) of `run()` and autograd.backward from `upstream(out)`."""
    counter = LaunchCounter()
    with counter, counter.phase("forward"):
        out = run()
    grad = upstream(out)
    with counter, counter.phase("backward"):
        torch.autograd.backward(out, grad)
    return counter.launches("forward"), counter.launches("backward"), counter.bytes_moved()


def meta_model(preset: str = BUDGET_PRESET):
    """The preset's model on the meta device, in bf16, experts grouped, training mode."""
    from hymo_core.models.layers.moe import RoutedExperts
    from hymo_core.models.model import Transformer
    from hymo_core.models.presets import PRESETS

    with torch.device("meta"):
        model = Transformer(PRESETS[preset], init_seed=0)
    model = model.to(torch.bfloat16).train()
    for module in model.modules():
        if isinstance(module, RoutedExperts):
            module.layout = "grouped"
    return model


def count_units(preset: str = BUDGET_PRESET, batch: int = BUDGET_BATCH, seq: int = BUDGET_SEQ) -> list[UnitCount]:
    """Each unit's count, then "rest" and "model" (the whole forward + backward with the loss)."""
    from hymo_core.models.layers.context import MixerContext

    model = meta_model(preset)
    config = model.config
    D = config.d_model
    ctx = MixerContext(model.rope_cos_TD2, model.rope_sin_TD2)
    blocks = list(model.layers)
    first = {kind: next(b for b in blocks if b.kind == kind) for kind in dict.fromkeys(b.kind for b in blocks)}

    def activations(T: int = seq) -> torch.Tensor:
        return torch.empty(batch, T, D, device="meta", dtype=torch.bfloat16, requires_grad=True)

    same = torch.empty_like
    units: list[UnitCount] = []

    def add(name: str, per_model: int, run, upstream=same) -> None:
        if per_model:
            model.zero_grad(set_to_none=True)  # a step's first backward writes .grad; accumulating would add launches
            units.append(UnitCount(name, per_model, *_count(run, upstream)))

    mixers = {"G": "gdn", "M": "mla", "A": "attention"}
    for kind, block in first.items():
        x = activations()
        add(mixers[kind], sum(b.kind == kind for b in blocks), lambda: block.attn(x, ctx))
    ffns: dict[str, list] = {}
    for block in blocks:
        ffns.setdefault("moe" if type(block.ffn).__name__ == "MoE" else "ffn", []).append(block.ffn)
    for name, modules in ffns.items():
        x = activations()
        add(name, len(modules), lambda: modules[0](x))
    tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    if model.mtp is not None:
        hidden = activations()
        add("mtp", 1, lambda: model._training_extras(hidden, tokens), upstream=lambda out: torch.ones_like(out))

    def whole():
        return model(tokens, tokens)[1]

    model.zero_grad(set_to_none=True)
    total = UnitCount("model", 1, *_count(whole, upstream=lambda out: torch.ones_like(out)))
    counted = [sum(u.per_model * getattr(u, f) for u in units) for f in ("forward", "backward", "bytes_moved")]
    rest = UnitCount("rest", 1, total.forward - counted[0], total.backward - counted[1], total.bytes_moved - counted[2])
    return units + [rest, total]


def format_table(units: list[UnitCount], budget: dict[str, tuple[int, int]] | None = None) -> str:
    """A markdown table: per unit its launches forward / backward, bytes, and the model-wide totals."""
    lines = ["| unit | in model | forward | backward | fwd + bwd | GB moved | x in model: launches | GB |" +
             (" budget |" if budget else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if budget else "")]
    for u in units:
        row = (f"| {u.name} | {u.per_model} | {u.forward:,} | {u.backward:,} | {u.launches:,} | {u.bytes_moved / 1e9:.2f} | "
               f"{u.per_model * u.launches:,} | {u.per_model * u.bytes_moved / 1e9:.1f} |")
        if budget:
            limit = budget.get(u.name)
            row += f" {limit[0]:,} / {limit[1] / 1e9:.2f} GB |" if limit else " |"
        lines.append(row)
    return "\n".join(lines)


def count_optimizer_step(preset: str = BUDGET_PRESET) -> tuple[int, int]:
    """(launches, bytes) of one steady-state step of the preset's optimizer (NorMuon + CautiousAdamW, its state
    already made by a first step), fp32 master weights on the meta device. The batching is issue 53's."""
    from hymo_core.models.model import Transformer
    from hymo_core.models.presets import PRESETS
    from hymo_core.train.optim import build_optimizer
    from hymo_core.train.optim_config import NorMuonConfig

    with torch.device("meta"):
        model = Transformer(PRESETS[preset], init_seed=0)
    optimizer = build_optimizer(model, NorMuonConfig())  # the preset's: NorMuon + CautiousAdamW, cautious decay
    for param in model.parameters():
        param.grad = torch.empty_like(param)
    optimizer.step()
    counter = LaunchCounter()
    with counter, counter.phase("optimizer"):
        optimizer.step()
    return counter.launches("optimizer"), counter.bytes_moved("optimizer")


def count_qk_clip(preset: str = BUDGET_PRESET) -> dict[str, int]:
    """Launches of QK-Clip's rescale over every softmax layer of the preset, with every head over the threshold and
    with none (the trainer's `QKClip.apply` after an update; the probe is the attention unit's)."""
    from hymo_core.train.trainer import QKClip

    model = meta_model(preset).float()  # fp32 master weights, as the optimizer holds them
    counts = {}
    for label, maximum in (("clipped", 150.0), ("none clipped", 50.0)):
        clip = QKClip(model, threshold=100.0, enabled=True)
        clip.maxima_LH = torch.full((len(model.softmax_mixers()), model.config.n_heads), maximum, device="meta")
        counter = LaunchCounter()
        with counter:
            clip.apply()
        counts[label] = counter.launches()
    return counts

"""The trainer's own step on synthetic tokens: what bench/gpu_check.py's MFU and profile rows time.

A user's figure is `hymo train` with the preset: `hymo_core.train.trainer.train` with the preset's
[train] defaults (NorMuon + CautiousAdamW, cautious decay), bf16 autocast on CUDA, the logit probe and
QK-Clip, the trainer's clip, the trainer's wrapping (`build_parallel_model`: no FSDP on one rank; FSDP2
when asked) and a realistic gradient accumulation, with a logging step every `log_interval` updates (its
weight snapshot and fp64 update ratios included, amortised as in a real run). Only the data differs:
seeded random tokens made on the host, so no corpus is needed.

`logging_step_launches` counts, with the launch counter and the trainer's step ranges, what a logging
step launches beyond an ordinary one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from hymo_core.models.configs import ModelConfig
from hymo_core.train.config import TrainConfig


@dataclass
class _NoCorpus:
    """What the monitor asks of a corpus: shard entries without indexes (tokens per source: not counted)."""

    def shard_entries(self, split: str) -> list[dict]:
        return [{"index_path": None}]


@dataclass
class SyntheticTokens:
    """A TokenLoader's stepping interface over seeded random windows (x, y), made on the host as the real one is."""

    vocab_size: int
    batch: int
    seq_len: int
    seed: int = 0
    split: str = "train"
    epoch: int = 0
    position: int = 0
    corpus: _NoCorpus = field(default_factory=_NoCorpus)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, self.vocab_size, (self.batch, self.seq_len + 1), generator=self.generator)
        self.position += self.batch
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        if torch.cuda.is_available():  # pinned, so the trainer's non_blocking copies are asynchronous
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    def start_next_epoch(self) -> None:
        self.epoch, self.position = self.epoch + 1, 0


def preset_train_config(preset: str, batch: int, seq_len: int, accumulation: int, *, max_steps: int, compile: bool = False,
                        log_interval: int = 10, precision: str = "bf16") -> TrainConfig:
    """The preset's [train] defaults at this batch; no evaluation or checkpoint inside the measured steps."""
    from hymo_core.models.presets import PRESET_TRAINING

    return TrainConfig(batch_size=batch, seq_len=seq_len, gradient_accumulation_steps=accumulation, max_steps=max_steps,
                       warmup_steps=1, log_interval=log_interval, eval_interval=10**9, checkpoint_interval=10**9,
                       precision=precision, compile=compile, peak_lr=1e-4, **PRESET_TRAINING.get(preset, {}))


def build(model_config: ModelConfig, config: TrainConfig, device: torch.device, fsdp: bool = False):
    """The model and optimizer as `hymo train` builds them; `fsdp`: FSDP2 on this one rank (the old layout)."""
    from hymo_core.distributed.parallelize import apply_fsdp, build_parallel_model
    from hymo_core.distributed.process_group import Runtime
    from hymo_core.models.init import materialise_
    from hymo_core.train.optim import build_optimizer

    runtime = Runtime(device=device)
    torch.manual_seed(config.seed)
    model_config = replace(model_config, max_seq_len=max(model_config.max_seq_len, config.seq_len))
    if fsdp:
        from hymo_core.distributed.parallelize import parallelize
        from hymo_core.models.init import build_on_meta

        model = parallelize(build_on_meta(model_config), runtime, config)
        apply_fsdp(model, replace(runtime, launched=True), config)
        model = materialise_(model, device)
    else:
        model = build_parallel_model(model_config, runtime, config)
    return model, build_optimizer(model, config.optimizer_config(device))


def run_steps(model, optimizer, config: TrainConfig, device: torch.device, vocab_size: int,
              on_update: Callable[[int], None] | None = None) -> list[float]:
    """`config.max_steps` updates of the trainer's loop; returns the host clock at the end of each update."""
    from hymo_core.train.trainer import TrainHooks, TrainState, train

    marks: list[float] = []

    def updated(state, loss, lr) -> None:
        marks.append(time.perf_counter())
        if on_update is not None:
            on_update(state.step)

    loader = SyntheticTokens(vocab_size, config.batch_size, config.seq_len, config.seed)
    train(model, optimizer, loader, None, config, TrainState(), device, TrainHooks(on_update=updated))
    return marks


def logging_step_launches(model_config: ModelConfig, preset: str = "", batch: int = 2, seq_len: int = 32,
                          accumulation: int = 2, log_interval: int = 10) -> dict[str, Any]:
    """Launches of an ordinary update and what a logging update adds (the trainer on the CPU, fp32), and that
    extra amortised over `log_interval` updates.

    Counted in windows between the trainer's on_update calls, so it needs nothing of the code it counts
    (bench/launch_budget.py runs it on an older tree too). Window k runs from update k's on_update to update
    k + 1's: update k's logging record (when k is logged) and update k + 1's body (with the weights' snapshot
    and update ratios when k + 1 is logged). Seven updates logged every 3rd: window 4 is an ordinary body,
    window 2 a logged body, window 3 a logging record plus an ordinary body.
    """
    from hymo_core.train.launch_count import LaunchCounter

    config = preset_train_config(preset, batch, seq_len, accumulation, max_steps=7, log_interval=3, precision="fp32")
    device = torch.device("cpu")
    model, optimizer = build(model_config, config, device)
    counter = LaunchCounter(sdpa_as_flash=False)  # the CPU has no flash kernel; attention is the same in every update

    def next_window(step: int) -> None:
        counter.current = f"window {step}"

    with counter:
        run_steps(model, optimizer, config, device, model_config.vocab_size, next_window)
    ordinary = counter.launches("window 4")
    snapshot_and_ratios = counter.launches("window 2") - ordinary
    record = counter.launches("window 3") - ordinary
    extra = snapshot_and_ratios + record
    return {"ordinary": ordinary, "logging_extra": extra, "snapshot_and_ratios": snapshot_and_ratios, "record": record,
            "log_interval": log_interval, "amortised_per_update": extra / log_interval}

"""The training loop: one successful optimizer update per iteration, every failure branch explicit.

Seed 002 is the contract followed here. In order, one attempt at update
`state.step + 1`:

1. the LR for that candidate step goes to every optimizer group;
2. each of `gradient_accumulation_steps` micro-batches reads fresh data, runs
   the forward under autocast, raises on a non-finite loss *before* backward,
   back-propagates `loss / accum` and counts its tokens;
3. unscale (fp16) -> global-norm clip (the norm is logged before clipping) ->
   QK-Clip validates its observations -> `scaler.step` -> a dropped scale
   means the fp16 update was skipped -> QK-Clip rescales over-threshold heads
   only after a real update -> gradients cleared.

Three clocks, kept apart: `step` counts successful updates (it drives the LR
and the log/eval/checkpoint intervals), `tokens_seen` counts every consumed
micro-batch (skipped attempts included), `skipped_updates` counts fp16
overflows. A skip retries the same step with the next data; 32 in a row raise.

The loop does no file IO: logging, validation results and checkpoints go
through `TrainHooks`, so the same loop serves the CLI, the pipeline stage,
tests and benchmarks. Nothing assumes one process: the optimizer, the model
and the loaders are passed in.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

from hymo_core.train.config import TrainConfig
from hymo_core.train.data import EndOfEpoch, TokenLoader, ValidationLoader
from hymo_core.train.noise_scale import NoiseScale, gradient_square_norm
from hymo_core.train.step_ranges import step_range
from hymo_core.distributed.process_group import (Runtime, all_gather_objects, all_reduce_max_, all_reduce_sum_, clip_grad_norm_,
                                                reduce_expert_load_)
from hymo_core.train.alerts import AlertBook, Firing, parse_alerts
from hymo_core.train.ema import WeightEMA
from hymo_core.train.monitor import RunMonitor, model_flops_per_token
from hymo_core.train.optim import PartitionedOptimizer
from hymo_core.train.schedule import learning_rate_at_step

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
MAX_CONSECUTIVE_SKIPS = 32  # seed 002: an fp16 run that cannot make progress must stop


@dataclass
class TrainState:
    """Counters a resumed session continues from (seed 002: separate clocks)."""

    step: int = 0  # successful optimizer updates
    tokens_seen: int = 0  # every consumed micro-batch, skipped attempts included
    skipped_updates: int = 0  # fp16 overflows
    fixed_batch_offset: int | None = None  # overfit mode: loader position of the fixed batch
    grad_scaler_state: dict[str, Any] | None = None
    best_val_loss: float | None = None
    lr_scale: float = 1.0  # lowered by a `lower-lr` alert; multiplies the scheduled LR from then on
    # What the run has reported so far, {"alerts": AlertBook.state_dict(), "sources": SourceCounter.state_dict()}: set by
    # the loop before every checkpoint, restored from one on resume (None: start empty). Checkpoints store it as their own
    # top-level "monitor" entry, not inside the counters (hymo_core/checkpoint/common.py: monitor_entry).
    monitor: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        del values["monitor"]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainState":
        state = cls(**values)
        for name in ("step", "tokens_seen", "skipped_updates"):
            value = getattr(state, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"TrainState.{name} must be a non-negative integer, got {value!r}")
        if state.fixed_batch_offset is not None and state.fixed_batch_offset < 0:
            raise ValueError(f"TrainState.fixed_batch_offset must be >= 0, got {state.fixed_batch_offset}")
        return state


@dataclass
class TrainHooks:
    """Where the loop reports; every hook is optional."""

    on_log: Callable[[dict[str, Any]], None] | None = None  # one record per logged step
    on_eval: Callable[[int, dict[str, Any]], None] | None = None  # (step, {"val_loss", and per group with a HeldOutSet})
    on_checkpoint: Callable[[TrainState], None] | None = None  # gradients are cleared when called
    on_event: Callable[[dict[str, Any]], None] | None = None  # skips and other notable events
    # (state, loss, lr) after every update; the loss is a 0-dim device tensor (float() it to read it: a host sync)
    on_update: Callable[[TrainState, torch.Tensor, float], None] | None = None
    on_alert: Callable[[dict[str, Any]], None] | None = None  # one record per alert that fired, naming its action


class TrainingStopped(RuntimeError):
    """An alert whose action is `stop` fired; the message names it, its value and the step."""


class NonFiniteTraining(FloatingPointError):
    """A non-finite loss, gradient norm or attention logit the loop cannot go on from (no skip-batch alert took it).

    The loop turns it into the nonfinite alert's row (and, with the default `stop`, a TrainingStopped) before it
    leaves, so the run's records say what ended it.
    """

    def __init__(self, message: str, step: int, metric: str, value: float = math.nan):
        super().__init__(message)
        self.step, self.metric, self.value = step, metric, value


class NonFiniteStopped(TrainingStopped, FloatingPointError):
    """The nonfinite alert's `stop`: a TrainingStopped (run.py writes the summary) that is still the FloatingPointError
    callers of the loop have always caught."""


# ---------------------------------------------------------------- setup checks


def validate_setup(model: nn.Module, config: TrainConfig, device: torch.device) -> None:
    """Refuse precisions the device cannot run and mixed precision over non-fp32 weights (seed 002)."""
    if config.precision == "fp16" and device.type == "cpu" and not config.allow_cpu_fp16:
        raise ValueError("fp16 training is refused on CPU (no fp16 GradScaler path there); use fp32 or bf16")
    if config.precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("bf16 requested but this CUDA device has no native bf16 support")
    wrong = [name for name, p in model.named_parameters() if p.dtype != torch.float32]
    if wrong:
        raise ValueError(f"master weights must be fp32 (autocast handles {config.precision}); not fp32: {', '.join(wrong[:5])}")
    if config.qk_clip and getattr(getattr(model, "config", None), "qk_norm", False):
        raise ValueError("qk_clip with qk_norm: the per-head norm undoes a q/k projection rescale; enable one of them")
    if config.overfit_one_batch and config.gradient_accumulation_steps != 1:
        raise ValueError("overfit_one_batch rereads one batch; use gradient_accumulation_steps = 1")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def make_scaler(config: TrainConfig, device: torch.device, state: TrainState) -> torch.amp.GradScaler:
    """Enabled for fp16 only; bf16 has fp32's exponent range and needs no loss scaling."""
    scaler = torch.amp.GradScaler(device.type, init_scale=config.fp16_init_scale, enabled=config.precision == "fp16")
    if scaler.is_enabled() and state.grad_scaler_state:
        scaler.load_state_dict(state.grad_scaler_state)
    return scaler


# ---------------------------------------------------------------- QK-Clip


class QKClip:
    """Per-head max-logit observation and post-update rescaling of query/key weights (MuonClip).

    For a head whose largest |q.k|/sqrt(d) in the attempt exceeded tau, gamma =
    tau / max; each softmax mixer's `qk_clip_(gamma_H)` shrinks that head's
    logits by gamma (heads under tau get 1). Everything stays on the device:
    one host read per update (the clipped-head count). Under data parallelism
    the maxima are max-reduced over ranks first, so every rank rescales the
    same heads of its shard.
    """

    def __init__(self, model: nn.Module, threshold: float, enabled: bool):
        self.model, self.threshold, self.enabled = model, threshold, enabled
        self.maxima_LH: torch.Tensor | None = None

    def reset(self) -> None:
        self.maxima_LH = None

    def observe(self) -> None:
        maxima = self.model.attention_max_logits().detach()
        self.maxima_LH = maxima if self.maxima_LH is None else torch.maximum(self.maxima_LH, maxima)

    def reduce(self) -> None:
        """Max over ranks (a no-op in one process); call once per update, after the last micro-batch."""
        if self.maxima_LH is not None:
            all_reduce_max_(self.maxima_LH)

    def max_logit(self) -> float | None:
        return None if self.maxima_LH is None or self.maxima_LH.numel() == 0 else float(self.maxima_LH.max())

    def validate(self, step: int = 0) -> None:
        """Before the optimizer mutates anything: a non-finite observation is a failed attempt."""
        if self.enabled and self.maxima_LH is not None and not bool(torch.isfinite(self.maxima_LH).all()):
            raise NonFiniteTraining("non-finite attention logit observed; refusing the optimizer step", step, "max_attention_logit")

    def finite(self) -> torch.Tensor | None:
        """The device-side form of `validate` (steps without a host read): False when an observation is not finite."""
        if not self.enabled or self.maxima_LH is None:
            return None
        return torch.isfinite(self.maxima_LH).all()

    @torch.no_grad()
    def apply(self) -> torch.Tensor | int:
        """Rescale heads over the threshold; returns how many heads were clipped (a device count, read when logged)."""
        if not self.enabled or self.maxima_LH is None:
            return 0
        over_LH = self.maxima_LH > self.threshold
        gamma_LH = torch.where(over_LH, self.threshold / self.maxima_LH, torch.ones_like(self.maxima_LH))
        mixers = self.model.softmax_mixers()
        batched = getattr(type(mixers[0]), "qk_clip_all_", None) if mixers else None
        if batched is not None and all(type(m) is type(mixers[0]) for m in mixers):
            batched(mixers, gamma_LH)  # every layer's row factors at once (MLA: 2 L + 4 launches)
        else:
            for mixer, gamma_H in zip(mixers, gamma_LH):
                mixer.qk_clip_(gamma_H)  # the mixer knows which projection rows make a head's logits
        self.maxima_LH = None
        return over_LH.sum()


# ---------------------------------------------------------------- validation


# The trainer's own Python and numpy generators (seeded by `seed_training_rng`), not the process-global
# ones: Prefect's threads draw from Python's global `random` while a flow trains, so a checkpoint that
# stored the global state would differ between two runs with equal weights.
TRAINER_RANDOM = random.Random(0)
TRAINER_NUMPY = np.random.RandomState(0)


def seed_training_rng(seed: int) -> None:
    TRAINER_RANDOM.seed(seed)
    TRAINER_NUMPY.seed(seed)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    state = {"python": TRAINER_RANDOM.getstate(), "numpy": TRAINER_NUMPY.get_state(), "torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    TRAINER_RANDOM.setstate(state["python"])
    TRAINER_NUMPY.set_state(state["numpy"])
    torch.set_rng_state(state["torch_cpu"])
    if state.get("torch_cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])


@torch.no_grad()
def evaluate(model: nn.Module, loader: ValidationLoader, device: torch.device, precision: str = "fp32",
             runtime: Runtime | None = None) -> float:
    """Token-weighted mean loss over the loader's fixed prefix (it restarts at offset 0 every time).

    Over W ranks, rank r scores batches r, r + W, ...; the sums are all-reduced, so the
    number equals one process's within float rounding. Every rank runs as many forwards
    (FSDP's are collective): a rank short of a batch repeats one and counts it zero times.
    The model's mode, its attention probe and every RNG are restored afterwards, even when
    the forward fails, so validation never perturbs training.
    """
    runtime = runtime or Runtime(device=device)
    was_training = model.training
    probe = any(getattr(b.attn, "probe", False) for b in getattr(model, "layers", []))
    rng = capture_rng()
    model.eval()
    if probe:
        model.set_attention_probe(False)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # (loss x tokens, tokens), reduced where nccl can
    try:
        mine = list(range(runtime.rank, len(loader), runtime.world_size))
        for index in range(-(-len(loader) // runtime.world_size)):
            counted = index < len(mine)
            x_BT, y_BT = loader.batch(mine[index] if counted else (mine[-1] if mine else 0))
            x_BT, y_BT = x_BT.to(device), y_BT.to(device)
            with autocast(device, precision):
                _, loss = model(x_BT, y_BT)
            ce = getattr(model, "last_ce", None)
            if counted:
                sums += torch.tensor([float(ce if ce is not None else loss) * y_BT.numel(), y_BT.numel()], dtype=torch.float64,
                                     device=device)
    finally:
        model.train(was_training)
        if probe:
            model.set_attention_probe(True)
        restore_rng(rng)
    all_reduce_sum_(sums)
    if sums[1] == 0:
        raise ValueError("validation loader yielded no full batch; lower batch_size / seq_len or add validation data")
    return float(sums[0] / sums[1])


def continuations_over_ranks(model: nn.Module, device: torch.device, runtime: Runtime):
    """A cloze scorer for hymo_core.evaluation.score_cloze: rank r scores pairs r, r + W, ...; all ranks get all.

    As in `evaluate`, every rank runs the same number of forwards (a short rank repeats one).
    """
    from hymo_core.eval.evaluation import continuation_logprob

    def score(pairs: list[tuple[list[int], list[int]]]) -> list[float]:
        mine = list(range(runtime.rank, len(pairs), runtime.world_size))
        totals = {}
        for index in range(-(-len(pairs) // runtime.world_size)):
            pair = mine[index] if index < len(mine) else (mine[-1] if mine else 0)
            total = continuation_logprob(model, *pairs[pair], device)
            if index < len(mine):
                totals[pair] = total
        merged = {k: v for part in all_gather_objects(totals) for k, v in part.items()}
        return [merged[i] for i in range(len(pairs))]

    return score


# ---------------------------------------------------------------- data


def next_training_batch(loader: TokenLoader, config: TrainConfig, state: TrainState, fixed: list) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh batch; at the end of an epoch, the next seeded epoch (the loader never wraps by itself)."""
    if config.overfit_one_batch:
        if not fixed:
            if state.fixed_batch_offset is None:
                state.fixed_batch_offset = loader.position
            fixed.append(read_batch_at(loader, state.fixed_batch_offset))
        return fixed[0]
    try:
        return loader.next_batch()
    except EndOfEpoch:
        loader.start_next_epoch()
        return loader.next_batch()


def read_batch_at(loader: TokenLoader, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The epoch-0 batch at `position`, leaving the loader's cursor where it was."""
    saved = loader.state_dict()
    loader.load_state_dict({**saved, "epoch": 0, "position": position, **_window_at(loader, 0, position)})
    try:
        return loader.next_batch()
    finally:
        loader.load_state_dict(saved)


def _window_at(loader: TokenLoader, epoch: int, position: int) -> dict[str, int]:
    order = loader._permutation(epoch)
    if position >= len(order):
        return {"shard": -1, "offset": -1}
    shard, offset = loader.windows[order[position]]
    return {"shard": int(shard), "offset": int(offset)}


# ---------------------------------------------------------------- host reads


def reads_host(config: TrainConfig, step: int, evaluates: bool, checkpoints: bool) -> bool:
    """Whether update `step` reads device values back: logged, evaluated, checkpointed, or the last."""
    return (step % config.log_interval == 0 or step == config.max_steps
            or (evaluates and step % config.eval_interval == 0)
            or (checkpoints and step % config.checkpoint_interval == 0))


class DeferredChecks:
    """Failure checks of steps that do not read the host, kept on the device until one that does.

    Seed 002 raises on a non-finite loss before backward. A step that reads nothing back cannot, so
    it records the first step whose loss, gradient norm or attention logits were not finite; the next
    reading step raises before it logs, evaluates or saves anything (no checkpoint holds the damage).
    With log_interval = 1 every step reads, and the seed's order holds exactly.
    """

    KINDS = ("loss", "gradient norm", "attention logit")

    def __init__(self, device: torch.device):
        self.first_bad_K: torch.Tensor | None = None  # first failing step per kind, 0 = none
        self.device = device

    def require(self, ok: torch.Tensor, kind: str, step: int) -> None:
        k = self.KINDS.index(kind)
        if self.first_bad_K is None:
            self.first_bad_K = torch.zeros(len(self.KINDS), dtype=torch.int64, device=self.device)
        unset = self.first_bad_K[k] == 0
        self.first_bad_K[k] = torch.where(unset & ~ok.to(self.device), step, self.first_bad_K[k])

    def raise_if_failed(self) -> None:
        if self.first_bad_K is None:
            return
        steps = self.first_bad_K.tolist()
        self.first_bad_K = None
        for kind, first in zip(self.KINDS, steps):
            if first:
                raise NonFiniteTraining(f"non-finite training {kind} at step {first} (found at the next step that reads "
                                        "the device); no later record or checkpoint was written", first, NONFINITE_METRICS[kind])


NONFINITE_METRICS = {"loss": "last_loss", "gradient norm": "grad_norm_pre_clip", "attention logit": "max_attention_logit"}


@dataclass
class Window:
    """The logging window's token-weighted loss (a device sum) and its counters."""

    loss_sum: torch.Tensor | None = None
    tokens: int = 0
    seconds: float = 0.0
    updates: int = 0

    def add(self, update_loss: torch.Tensor, tokens: int, seconds: float) -> None:
        weighted = update_loss * tokens
        self.loss_sum = weighted if self.loss_sum is None else self.loss_sum + weighted
        self.tokens, self.seconds, self.updates = self.tokens + tokens, self.seconds + seconds, self.updates + 1

    def mean_loss(self) -> torch.Tensor:
        return self.loss_sum / max(self.tokens, 1)


# ---------------------------------------------------------------- the loop


def train(
    model: nn.Module,
    optimizer: PartitionedOptimizer,
    train_loader: TokenLoader,
    val_loader: ValidationLoader | None,
    config: TrainConfig,
    state: TrainState,
    device: torch.device,
    hooks: TrainHooks | None = None,
    runtime: Runtime | None = None,
    ema: WeightEMA | None = None,
) -> TrainState:
    """Run successful updates until `state.step == config.max_steps`; returns the (mutated) state.

    `runtime` places this process among the ranks (default: one plain process).
    The loaders are per rank; each update reads the recipe's global batch.
    `ema`: the weights' moving average to continue (config.ema_decay > 0; default: a fresh one).
    """
    hooks = hooks or TrainHooks()
    runtime = runtime or Runtime(device=device)
    _, accumulation = runtime.batch_plan(config)
    validate_setup(model, config, device)
    if config.max_steps < state.step:
        raise ValueError(f"max_steps {config.max_steps} is below the resumed step {state.step}")
    schedule = config.schedule_config()
    model.train()
    optimizer.zero_grad(set_to_none=True)
    scaler = make_scaler(config, device, state)
    qk_clip = QKClip(model, config.qk_clip_threshold, config.qk_clip)
    monitor = RunMonitor(model, optimizer, config.max_grad_norm, device, config.precision,
                         model_flops_per_token(model, config.seq_len), train_loader)
    # Thresholds may name ln V (a uniform prediction's loss) and QK-Clip's tau (alerts.py, RUN_CONSTANTS).
    alerts = AlertBook(parse_alerts(config.alerts), {"ln_vocab": math.log(model.config.vocab_size), "tau": config.qk_clip_threshold})
    restore_monitor(state, alerts, monitor)
    if ema is None and config.ema_decay:
        ema = WeightEMA(model, config.ema_decay)
    fixed_batch: list = []
    consecutive_skips = 0
    window = Window()
    checks = DeferredChecks(device)
    noise_scale = NoiseScale()  # the gradient noise scale, measured on logged steps that accumulate
    try:
        while state.step < config.max_steps:
            with step_range("step"):  # the whole update (hymo_core/train/step_ranges.py: free unless measured)
                started = time.perf_counter()
                step = state.step + 1  # the candidate successful update
                # Host reads (loss, grad norm, QK-Clip's finiteness, MoE figures) happen on steps whose
                # result leaves the loop (logged, evaluated, checkpointed, the last) and on every fp16 step
                # (GradScaler reads its overflow flag); every other step only queues device work.
                # A skip-batch alert judges every step's loss and gradient norm before the update: it reads both each step.
                host_step = (scaler.is_enabled() or alerts.checks_every_step
                             or reads_host(config, step, val_loader is not None, hooks.on_checkpoint is not None))
                logged = step % config.log_interval == 0 or step == config.max_steps
                if host_step:
                    checks.raise_if_failed()  # a failure a non-reading step recorded on the device stops here
                lr = learning_rate_at_step(schedule, step) * state.lr_scale
                optimizer.set_learning_rate(lr)
                qk_clip.reset()
                monitor.start_update(logged)  # activation / log-Z hooks exist on logging steps only
                # The probe costs a chunked q.k pass per layer: only when QK-Clip acts or this step is logged.
                probing = config.qk_clip or logged
                # A step that only clips needs exact maxima only above tau: the probe skips blocks a norm bound clears.
                model.set_attention_probe(probing, skip_below=None if logged else config.qk_clip_threshold)
                update_loss, update_tokens, update_mtp_ce = None, 0, []
                # Noise scale (hymo_core/train/noise_scale.py): the first micro-batch's |grad|^2 vs the update's, logged steps only.
                small_sq, small_tokens = None, 0
                bad_batch = False
                reserve = getattr(train_loader, "reserve_update", None)  # a mixing loader (cpt replay) rolls its sides itself
                if reserve is not None and not config.overfit_one_batch:
                    reserve(config.batch_size * config.gradient_accumulation_steps)  # epochs turn here, between updates
                for _ in range(accumulation):
                    with step_range("data"):
                        waiting = time.perf_counter()
                        x_BT, y_BT = next_training_batch(train_loader, config, state, fixed_batch)
                        monitor.waited_for_data(time.perf_counter() - waiting)  # the host clock: no device sync
                        x_BT, y_BT = x_BT.to(device, non_blocking=True), y_BT.to(device, non_blocking=True)
                    with step_range("forward"), autocast(device, config.precision):
                        _, loss = model(x_BT, y_BT)
                    if host_step:
                        value = loss.item()
                        if not math.isfinite(value):
                            if not alerts.checks_every_step:
                                raise NonFiniteTraining(f"non-finite training loss {value} at step {step}; nothing was back-propagated",
                                                        step, "last_loss", value)
                            # A skip-batch alert judges it below, before anything is mutated. One process stops reading now;
                            # several ranks carry on, so that every rank makes the same collectives: the all-reduced loss
                            # is then non-finite on all of them, and they skip (or raise) together.
                            if runtime.world_size == 1:
                                update_loss, bad_batch = loss.detach().float(), True
                                state.tokens_seen += y_BT.numel()  # consumed, though never learned from
                                break
                    else:
                        checks.require(torch.isfinite(loss.detach()), "loss", step)
                    if probing:
                        qk_clip.observe()
                    with step_range("backward"):
                        scaler.scale(loss / accumulation).backward()
                    if logged and accumulation > 1 and small_sq is None:  # .grad holds micro-batch 1 / accumulation x scale
                        unscale = accumulation / (scaler.get_scale() if scaler.is_enabled() else 1.0)
                        small_sq, small_tokens = gradient_square_norm(model) * unscale**2, y_BT.numel() * runtime.world_size
                    ce = getattr(model, "last_ce", None)
                    micro = (ce if ce is not None else loss).detach().float() / accumulation
                    update_loss = micro if update_loss is None else update_loss + micro
                    mtp_ce = [c.detach().float() / accumulation for c in getattr(model, "last_mtp_ce", [])]
                    update_mtp_ce = [a + b for a, b in zip(update_mtp_ce, mtp_ce)] if update_mtp_ce else mtp_ce
                    update_tokens += y_BT.numel() * runtime.world_size  # every rank reads as many
                    state.tokens_seen += y_BT.numel() * runtime.world_size
                # The global batch's loss, the same on every rank (device tensors: one collective, no host read).
                update_loss = all_reduce_sum_(update_loss) / runtime.world_size
                update_mtp_ce = [all_reduce_sum_(value) / runtime.world_size for value in update_mtp_ce]
                qk_clip.reduce()

                with step_range("clip"):
                    scaler.unscale_(optimizer)
                    if bad_batch:
                        grad_norm_t = torch.full((), math.nan, device=device)
                    else:
                        grad_norm_t = clip_grad_norm_(model.parameters(), config.max_grad_norm or float("inf"))
                    if host_step and not (scaler.is_enabled() or alerts.checks_every_step):  # the read error_if_nonfinite made
                        norm = float(grad_norm_t)
                        if not math.isfinite(norm):
                            raise NonFiniteTraining(f"non-finite gradient norm {norm} at step {step}; nothing was applied", step,
                                                    "grad_norm_pre_clip", norm)
                firing = None
                if alerts.checks_every_step:  # the recipe asked for skip-batch: this step's two numbers, read now
                    step_loss, step_grad_norm = torch.stack([update_loss.float(), grad_norm_t.detach().float()]).tolist()
                    firing = alerts.check_step(step, step_loss, step_grad_norm)
                    if firing is None and not (math.isfinite(step_loss) and (scaler.is_enabled() or math.isfinite(step_grad_norm))):
                        what = f"loss {step_loss}" if not math.isfinite(step_loss) else f"gradient norm {step_grad_norm}"
                        metric, bad = ("last_loss", step_loss) if not math.isfinite(step_loss) else ("grad_norm_pre_clip", step_grad_norm)
                        raise NonFiniteTraining(f"non-finite training {what} at step {step} and no skip-batch alert took it; "
                                                "nothing was applied", step, metric, bad)
                if firing is not None:  # skip-batch: this batch's gradients are dropped, the same step is tried on the next one
                    optimizer.zero_grad(set_to_none=True)
                    qk_clip.reset()
                    model.discard_routing_counts()
                    if scaler.is_enabled():
                        scaler.update()  # unscale_ ran: the scaler's per-update state must close
                    monitor.after_step(grad_norm_t, applied=False)
                    state.skipped_updates += 1
                    act([firing], state, hooks, alerts)
                    continue
                if not host_step:
                    checks.require(torch.isfinite(grad_norm_t), "gradient norm", step)
                    finite_logits = qk_clip.finite()
                    if finite_logits is not None:
                        checks.require(finite_logits, "attention logit", step)
                with step_range("log"):
                    monitor.before_step(logged)  # hooks off; on a logging step, the weights before the update
                previous_scale = scaler.get_scale() if scaler.is_enabled() else None
                if host_step:
                    qk_clip.validate(step)
                with step_range("optimizer"):
                    scaler.step(optimizer)
                    scaler.update()
                state.grad_scaler_state = scaler.state_dict() if scaler.is_enabled() else None
                skipped = scaler.is_enabled() and scaler.get_scale() < previous_scale
                # A host read of the maxima only when the record is written (QK-Clip's own read is its clipped count).
                max_logit = qk_clip.max_logit() if logged else None
                clipped_heads, expert_load = 0, {}
                with step_range("after_step"):
                    if skipped:
                        qk_clip.reset()  # observations of a discarded update must not rescale weights
                        model.discard_routing_counts()  # nor its MoE token counts move a gate bias
                    else:
                        clipped_heads = qk_clip.apply()
                        # Per-block bookkeeping: MoE gate-bias step on the token counts of every rank; figures when logged.
                        expert_load = model.after_optimizer_step(reduce_expert_load_, read=logged)
                    optimizer.zero_grad(set_to_none=True)
                with step_range("log"):
                    monitor.after_step(grad_norm_t, applied=not skipped)  # clip count on the device; update RMS when logged

                if skipped:
                    state.skipped_updates += 1
                    consecutive_skips += 1
                    if hooks.on_event:
                        hooks.on_event({"event": "fp16_overflow_skip", "step": step, "scale": scaler.get_scale(),
                                        "consecutive": consecutive_skips, "tokens_seen": state.tokens_seen})
                    if consecutive_skips >= MAX_CONSECUTIVE_SKIPS:
                        raise FloatingPointError(f"{consecutive_skips} consecutive fp16 updates overflowed at step {step}; giving up")
                    continue
                consecutive_skips = 0
                state.step = step
                if ema is not None:
                    ema.update()  # one fused device op over the weights after the update (and QK-Clip's rescale)
                window.add(update_loss, update_tokens, time.perf_counter() - started)
                if hooks.on_update:
                    hooks.on_update(state, update_loss, lr)  # a 0-dim device tensor: reading it is the hook's choice

                final = state.step == config.max_steps
                if host_step:
                    checks.raise_if_failed()  # nothing is logged, evaluated or saved after a recorded failure
                firings: list[Firing] = []
                with step_range("log"):
                    if logged:
                        loss_mean, last_loss, grad_norm, clipped, small_sq_value, *mtp_values = torch.stack(
                            [window.mean_loss(), update_loss, grad_norm_t.detach().float(), torch.as_tensor(clipped_heads).to(update_loss),
                             (small_sq if small_sq is not None else torch.zeros(())).to(update_loss),
                             *update_mtp_ce]).tolist()  # the logging step's one host read
                        tokens_per_s = window.tokens / max(window.seconds, 1e-9)
                        record = {
                            "step": state.step, "loss": loss_mean, "last_loss": last_loss,
                            "grad_norm_pre_clip": grad_norm,
                            "lr": {group["group"]: group["lr"] for group in optimizer.param_groups},
                            "tokens_per_s": tokens_per_s, "tokens_seen": state.tokens_seen,
                            "skipped_updates": state.skipped_updates, "max_attention_logit": max_logit, "qk_clipped_heads": int(clipped),
                            **monitor.record_fields(window.seconds, window.tokens),  # the seed's other signals (monitor.py)
                        }
                        if mtp_values:
                            record["mtp_ce"] = mtp_values  # per depth, this update's micro-batch mean
                        if expert_load:
                            record["moe"] = expert_load  # per MoE layer: this update's loads, bias norm, drops
                        if small_sq is not None:
                            record["noise_scale"] = noise_scale.add(small_sq_value, grad_norm**2, small_tokens, update_tokens)
                        if hooks.on_log:
                            hooks.on_log(record)
                        window = Window()
                        firings += alerts.check_record(record)
                if val_loader is not None and (final or state.step % config.eval_interval == 0):
                    val = validate(model, val_loader, device, config.precision, runtime)
                    val["tokens_seen"] = state.tokens_seen
                    if ema is not None:  # the EMA weights on the same windows: the same protocol
                        with ema.swapped_in():
                            averaged = validate(model, val_loader, device, config.precision, runtime)
                        val.update({"ema_val_loss": averaged["val_loss"], "ema_val_bpb": averaged.get("val_bpb")})
                    if state.best_val_loss is None or val["val_loss"] < state.best_val_loss:
                        state.best_val_loss = val["val_loss"]
                    if hooks.on_eval:
                        hooks.on_eval(state.step, val)
                    firings += alerts.check_record(val, step=state.step)
                if final:
                    firings += alerts.unresolved(state.step)  # spikes held for a next log that will not come are warnings
                checkpoint_due = final or state.step % config.checkpoint_interval == 0
                if checkpoint_due or any(f.action == "checkpoint" for f in firings):
                    state.monitor = monitor_state(alerts, monitor)  # after this step's alerts: a resume continues from here
                act(firings, state, hooks, alerts, checkpoint_due)
                if hooks.on_checkpoint and checkpoint_due:
                    hooks.on_checkpoint(state)
    except NonFiniteTraining as exc:  # the nonfinite alert's row first, so the records say what ended the run
        firing = alerts.fire_nonfinite(exc.step, exc.metric, exc.value)
        if firing is None:
            raise
        if hooks.on_alert:
            hooks.on_alert(firing.to_record())
        if firing.action == "stop":
            raise NonFiniteStopped(f"alert {firing.alert!r} fired at step {firing.step} ({exc}): action stop") from exc
        raise
    finally:
        model.set_attention_probe(False)
        monitor.close()
    return state


def monitor_state(alerts: AlertBook, monitor: RunMonitor) -> dict[str, Any]:
    """The checkpoint's "monitor" entry: alert history and per-source token totals, in plain JSON types."""
    return {"alerts": alerts.state_dict(), "sources": monitor.sources.state_dict() if monitor.sources is not None else None}


def restore_monitor(state: TrainState, alerts: AlertBook, monitor: RunMonitor) -> None:
    """A resumed run continues the alert history and the per-source totals its checkpoint recorded (None: start empty)."""
    if not state.monitor:
        return
    if state.monitor.get("alerts") is not None:
        alerts.load_state_dict(state.monitor["alerts"])
    if state.monitor.get("sources") is not None and monitor.sources is not None:
        monitor.sources.load_state_dict(state.monitor["sources"])


def validate(model: nn.Module, val_loader: Any, device: torch.device, precision: str, runtime: Runtime | None = None) -> dict[str, Any]:
    """{"val_loss": ...}; a held-out set (hymo_core.eval.heldout.HeldOutSet) adds bits per byte and per-group losses."""
    if isinstance(val_loader, ValidationLoader):
        return {"val_loss": evaluate(model, val_loader, device, precision, runtime)}
    return val_loader.evaluate(model, device, precision, runtime).to_record()


def act(firings: list[Firing], state: TrainState, hooks: TrainHooks, alerts: AlertBook, checkpoint_due: bool = False) -> None:
    """What each alert that fired asks for (alerts.py); skip-batch was already done by the caller."""
    for firing in firings:
        if hooks.on_alert:
            hooks.on_alert(firing.to_record())
    for firing in firings:
        if firing.severity != "warning":
            continue  # information (a recovered spike, a loss below the forecast band): recorded, nothing done
        if firing.action == "lower-lr":
            state.lr_scale *= alerts.factor_of(firing)
        elif firing.action == "checkpoint" and hooks.on_checkpoint and not checkpoint_due:
            hooks.on_checkpoint(state)
            checkpoint_due = True  # one checkpoint however many alerts ask for it
        elif firing.action == "stop":
            raise TrainingStopped(f"alert {firing.alert!r} fired at step {firing.step} ({firing.metric} = {firing.value}): action stop")

"""A training step that is not logged reads nothing back from the device (issue 23 part 4).

Counted, not timed: every Python-level way a tensor reaches the host (`item`, `tolist`,
`__float__`, `__int__`, `__bool__`) is patched to count its calls while hymo-tiny (GDN + MLA, MoE
on the MLA layer, MTP depth 2, QK-Clip on) trains steps that are not logged, evaluated or saved.
Data-dependent shapes (`nonzero`, boolean masks, `repeat_interleave` with tensor repeats) are host
syncs too, invisible here: test_host_sync_dispatch.py counts them at torch's dispatch level.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.models.model import Transformer
from hymo_core.train.optim import build_optimizer
from hymo_core.models.presets import PRESETS, PRESET_TRAINING
from hymo_core.train.trainer import TrainConfig, TrainHooks, TrainState, train

CPU = torch.device("cpu")
READS = ("item", "tolist", "__float__", "__int__", "__bool__")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class HostReads:
    """Counts calls of the patched Tensor methods while `counting` is on, with the caller's line."""

    def __init__(self, monkeypatch):
        self.counting, self.calls = False, []
        for name in READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, original))

    def _counted(self, name, original):
        def method(tensor, *args, **kwargs):
            if self.counting:
                import traceback
                frame = traceback.extract_stack(limit=2)[0]
                self.calls.append(f"{name} at {frame.filename}:{frame.lineno}")
            return original(tensor, *args, **kwargs)
        return method


@pytest.mark.parametrize("optimizer", ["normuon", "muon_adamw"])
def test_five_unlogged_hymo_tiny_steps_make_no_host_read(tiny_corpus, monkeypatch, optimizer):
    reader = CorpusReader(tiny_corpus)
    torch.manual_seed(0)
    model = Transformer(replace(PRESETS["hymo-tiny"], vocab_size=reader.vocab_size, max_seq_len=32))
    settings = {**PRESET_TRAINING["hymo-tiny"], "optimizer": optimizer}
    # Steps 2..6 are counted; 7 (the last) is logged. Logging, evaluation and checkpoints: step 100.
    # The monitor's clip counter and the weights' EMA run on every step too: device ops only.
    config = TrainConfig(batch_size=2, seq_len=32, max_steps=7, warmup_steps=2, log_interval=100, eval_interval=100,
                         checkpoint_interval=100, gradient_accumulation_steps=2, qk_clip=True, ema_decay=0.99, **settings)
    optim = build_optimizer(model, config.optimizer_config(CPU))
    loader = TokenLoader(reader, "train", config.seq_len, config.batch_size, config.seed)
    reads = HostReads(monkeypatch)
    counted_steps, logs = [], []

    def on_update(state, loss, lr):
        reads.counting = 1 <= state.step < 6  # from the end of step 1 to the end of step 6
        counted_steps.append(state.step)

    train(model, optim, loader, None, config, TrainState(), CPU, TrainHooks(on_update=on_update, on_log=logs.append))
    assert counted_steps == list(range(1, 8))
    assert reads.calls == [], reads.calls
    # The logged step still reports everything (its reads are the one place they happen).
    assert len(logs) == 1 and logs[0]["step"] == 7 and logs[0]["moe"] and len(logs[0]["mtp_ce"]) == 2
    assert logs[0]["noise_scale"]["b_small_tokens"] == 2 * 32  # the noise scale is measured on that step only
    assert isinstance(logs[0]["loss"], float) and isinstance(logs[0]["qk_clipped_heads"], int)


def test_the_counter_sees_a_host_read(monkeypatch):
    reads = HostReads(monkeypatch)
    reads.counting = True
    value = torch.ones(2).sum()
    float(value), value.item(), bool(value > 0)
    assert len(reads.calls) == 3

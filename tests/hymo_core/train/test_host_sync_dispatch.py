"""No host sync in an unlogged training step, counted at torch's dispatch level (issue 42, part 9).

tests/hymo_core/train/test_host_sync.py patches `item`, `tolist` and the dunder conversions in Python;
a `torch.nonzero` or a boolean-mask index inside the model passes it, yet each is a device-to-host
sync on CUDA (the output's size is read back). `HostSyncCounter` (hymo_core/train/host_sync.py) sees
them as aten calls. hymo-tiny (GDN + MLA, MoE on the MLA layer, MTP depth 2, QK-Clip) trains steps
that are not logged, evaluated or saved: none may sync. Then the same run with a nonzero or a
boolean-mask index slipped into `MoE.forward` must be caught, at that line.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hymo_core.models.layers.moe import MoE
from hymo_core.models.model import Transformer
from hymo_core.models.presets import PRESET_TRAINING, PRESETS
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.train.host_sync import HostSyncCounter
from hymo_core.train.optim import build_optimizer
from hymo_core.train.trainer import TrainConfig, TrainHooks, TrainState, train

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def unlogged_step_syncs(corpus, optimizer: str = "normuon") -> list:
    """The syncs of steps 2..4 of a 5-step hymo-tiny run logged only at its end (gradient accumulation 2)."""
    reader = CorpusReader(corpus)
    torch.manual_seed(0)
    model = Transformer(replace(PRESETS["hymo-tiny"], vocab_size=reader.vocab_size, max_seq_len=32))
    settings = {**PRESET_TRAINING["hymo-tiny"], "optimizer": optimizer}
    config = TrainConfig(batch_size=2, seq_len=32, max_steps=5, warmup_steps=2, log_interval=100, eval_interval=100,
                         checkpoint_interval=100, gradient_accumulation_steps=2, qk_clip=True, ema_decay=0.99, **settings)
    optim = build_optimizer(model, config.optimizer_config(CPU))
    loader = TokenLoader(reader, "train", config.seq_len, config.batch_size, config.seed)
    logs = []
    with HostSyncCounter(counting=False) as syncs:
        def on_update(state, loss, lr):
            syncs.counting = 1 <= state.step < 4  # from the end of step 1 to the end of step 4

        train(model, optim, loader, None, config, TrainState(), CPU, TrainHooks(on_update=on_update, on_log=logs.append))
    assert len(logs) == 1 and logs[0]["step"] == 5 and logs[0]["moe"]  # the logged step still reads its figures
    return syncs.events


@pytest.mark.parametrize("optimizer", ["normuon", "muon_adamw"])
def test_unlogged_hymo_tiny_steps_make_no_host_sync(tiny_corpus, optimizer):
    events = unlogged_step_syncs(tiny_corpus, optimizer)
    assert events == [], [str(e) for e in events]


@pytest.mark.parametrize("injection,op", [
    (lambda x: torch.nonzero(x.sum(-1) > 0), "aten.nonzero"),
    (lambda x: x[x > 0], "aten.index.Tensor with a boolean index"),
    (lambda x: torch.repeat_interleave(torch.ones(2, dtype=torch.long, device=x.device)), "aten.repeat_interleave"),
], ids=["nonzero", "boolean-mask-index", "repeat_interleave"])
def test_a_sync_slipped_into_moe_forward_is_caught(tiny_corpus, monkeypatch, injection, op):
    original = MoE.forward

    def forward_with_a_sync(self, x_BTD):
        injection(x_BTD)
        return original(self, x_BTD)

    monkeypatch.setattr(MoE, "forward", forward_with_a_sync)
    events = unlogged_step_syncs(tiny_corpus)
    assert events, "the injected sync went unseen"
    assert all(str(e).startswith(op) and __file__ in e.where for e in events), [str(e) for e in events]
    # 3 counted steps x 2 micro-batches x the MoE layers of hymo-tiny (its MLA layers and MTP blocks with MoE)
    assert len(events) % 6 == 0


def test_the_counter_sees_python_and_aten_level_reads():
    x = torch.arange(6.0)
    with HostSyncCounter() as syncs:
        x.sum().item(), float(x.sum()), bool(x.sum() > 0), x.tolist(), x.numpy()
        torch.unique(x), x.masked_select(x > 2), torch.bincount(x.long())
        torch.repeat_interleave(x, torch.ones(6, dtype=torch.long), output_size=6)  # sized by the caller: no sync
        x[torch.tensor([1, 2])], torch.argsort(x), torch.searchsorted(x, x)  # static shapes: no sync
        syncs.counting = False
        x.sum().item()
    kinds = [e.op.split(" ")[0] for e in syncs.events]
    assert kinds == ["aten._local_scalar_dense.default"] * 3 + ["Tensor.tolist", "Tensor.numpy", "aten._unique2.default",
                                                              "aten.masked_select.default", "aten.bincount.default"]
    assert torch.Tensor.tolist is HostSyncCounter.__init__.__globals__["torch"].Tensor.tolist  # restored on exit

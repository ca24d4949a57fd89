"""Alerts that act: each injected fault (a NaN batch, a spiking LR, a stalled loader) fires its alert and its action happens."""
from __future__ import annotations

import math
import time

import pytest
import torch

from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train import trainer as trainer_module
from hymo_core.train.alerts import DEFAULT_ALERTS, AlertBook, AlertConfigError, AlertRule, fires, parse_alerts
from hymo_core.train.config import TrainConfig
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.train.optim import build_optimizer
from hymo_core.train.trainer import TrainHooks, TrainingStopped, TrainState, train

CPU = torch.device("cpu")


def setup(corpus, alerts, **overrides):
    values = dict(batch_size=4, seq_len=16, max_steps=8, warmup_steps=1, log_interval=1, eval_interval=100, checkpoint_interval=100,
                  alerts=alerts)
    values.update(overrides)
    config = TrainConfig(**values)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16))
    optimizer = build_optimizer(model, config.optimizer_config(CPU))
    loader = TokenLoader(CorpusReader(corpus), "train", config.seq_len, config.batch_size, config.seed)
    return model, optimizer, loader, config


def recording_hooks():
    seen = {"alerts": [], "logs": [], "checkpoints": []}
    hooks = TrainHooks(on_log=seen["logs"].append, on_alert=seen["alerts"].append,
                       on_checkpoint=lambda state: seen["checkpoints"].append(state.step))
    return hooks, seen


def test_rules_are_checked_when_parsed():
    with pytest.raises(AlertConfigError, match=r"#1: .*action must be one of"):
        parse_alerts([{"metric": "loss", "condition": "> 3", "action": "reboot"}])
    with pytest.raises(AlertConfigError, match="condition"):
        parse_alerts([{"metric": "loss", "condition": "about 3"}])
    with pytest.raises(AlertConfigError, match="skip-batch decides before the update"):
        parse_alerts([{"metric": "max_data_wait_s", "condition": "> 3", "action": "skip-batch"}])
    with pytest.raises(AlertConfigError, match="unknown keys"):
        parse_alerts([{"metric": "loss", "condition": "> 3", "severity": "high"}])
    assert parse_alerts(None) == DEFAULT_ALERTS
    assert parse_alerts([{"metric": "none"}]) == ()
    with pytest.raises(ValueError, match="alerts"):
        TrainConfig(alerts=({"metric": "loss", "condition": "> 3", "action": "panic"},))


def test_statistics():
    spike = AlertRule("last_loss", "zscore > 4", window=5)
    assert fires(spike, 9.0, [3.0, 3.1, 2.9, 3.0, 3.05])[0]
    assert not fires(spike, 3.1, [3.0, 3.1, 2.9, 3.0, 3.05])[0]
    assert not fires(spike, 9.0, [3.0])[0]  # too little history
    growth = AlertRule("max_attention_logit", "growth > 2", window=4)
    assert fires(growth, 9.0, [4.0, 4.5, 4.2])[0] and not fires(growth, 7.0, [4.0, 4.5, 4.2])[0]
    assert fires(AlertRule("nonfinite", "nonfinite", "stop"), math.nan, [])[0]


def poison_forward(model, at_calls):
    """The head's output turns NaN on the given forward calls (counted from 1): a batch whose loss is not finite."""
    calls = [0]

    def hook(module, inputs, output):
        calls[0] += 1
        return output * math.nan if calls[0] in at_calls else output

    return model.output.register_forward_hook(hook)


def test_nan_batch_is_skipped(tiny_corpus, one_torch_thread):
    model, optimizer, loader, config = setup(tiny_corpus, ({"metric": "nonfinite", "condition": "nonfinite", "action": "skip-batch"},))
    poison_forward(model, {3})
    hooks, seen = recording_hooks()
    state = train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)
    assert state.step == config.max_steps and state.skipped_updates == 1
    assert [(a["kind"], a["action"], a["step"]) for a in seen["alerts"]] == [("alert", "skip-batch", 3)]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nan_batch_stops_the_run_by_default(tiny_corpus, one_torch_thread):
    model, optimizer, loader, config = setup(tiny_corpus, None)
    poison_forward(model, {3})
    hooks, seen = recording_hooks()
    with pytest.raises((TrainingStopped, FloatingPointError), match="non-finite"):
        train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)


def test_spiking_lr_lowers_the_lr(tiny_corpus, one_torch_thread, monkeypatch):
    rule = {"metric": "last_loss", "condition": "zscore > 3", "window": 4, "action": "lower-lr", "factor": 0.5}
    model, optimizer, loader, config = setup(tiny_corpus, (rule,), max_steps=10, schedule="constant")
    scheduled = trainer_module.learning_rate_at_step
    monkeypatch.setattr(trainer_module, "learning_rate_at_step", lambda schedule, step: scheduled(schedule, step) * (300.0 if step == 6 else 1.0))
    hooks, seen = recording_hooks()
    state = train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)
    fired = [a for a in seen["alerts"] if a["action"] == "lower-lr"]
    assert fired and fired[0]["step"] == 7  # the spiked update's loss shows on the next batch
    assert state.lr_scale == 0.5 ** len(fired)
    lr_after = [max(r["lr"].values()) for r in seen["logs"] if r["step"] > fired[-1]["step"]]
    assert lr_after and all(lr == pytest.approx(config.peak_lr * state.lr_scale) for lr in lr_after)


class StallingLoader:
    """A real loader that stalls once, before the batch of one update."""

    def __init__(self, loader, stall_at_call, seconds):
        self.loader, self.stall_at_call, self.seconds, self.calls = loader, stall_at_call, seconds, 0

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def next_batch(self):
        self.calls += 1
        if self.calls == self.stall_at_call:
            time.sleep(self.seconds)
        return self.loader.next_batch()


def test_stalled_loader_takes_a_checkpoint(tiny_corpus, one_torch_thread):
    rule = {"metric": "max_data_wait_s", "condition": "> 0.4", "window": 1, "action": "checkpoint", "name": "stalled loader"}
    model, optimizer, loader, config = setup(tiny_corpus, (rule,), log_interval=2)
    hooks, seen = recording_hooks()
    train(model, optimizer, StallingLoader(loader, 3, 0.6), None, config, TrainState(), CPU, hooks)
    assert [(a["alert"], a["step"]) for a in seen["alerts"]] == [("stalled loader", 4)]
    assert seen["checkpoints"] == [4, 8]  # the alert's, then the final one


def test_stop_action_stops(tiny_corpus, one_torch_thread):
    model, optimizer, loader, config = setup(tiny_corpus, ({"metric": "loss", "condition": "> 0", "action": "stop"},), log_interval=2)
    hooks, seen = recording_hooks()
    with pytest.raises(TrainingStopped, match="loss > 0"):
        train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)
    assert seen["alerts"][0]["step"] == 2


def test_book_keeps_history_per_metric():
    book = AlertBook(parse_alerts([{"metric": "last_loss", "condition": "zscore > 3", "window": 3}]))
    for step, loss in enumerate([3.0, 3.1, 2.9, 3.0], 1):
        assert book.check_record({"kind": "train", "step": step, "last_loss": loss}) == []
    firing, = book.check_record({"kind": "train", "step": 5, "last_loss": 8.0})
    assert firing.step == 5 and firing.action == "log" and firing.statistic > 3


def test_recipe_alerts_round_trip_through_the_pretrain_stage_toml(tmp_path):
    from hymo_core.train.run import load_run_config
    from tasks.pretrain import recipe_toml

    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[train]\nmax_steps = 50\n\n[[alerts]]\nmetric = "last_loss"\ncondition = "zscore > 4"\naction = "lower-lr"\n', encoding="utf-8")
    train_config, model_config = load_run_config(recipe)
    assert train_config.alerts == ({"metric": "last_loss", "condition": "zscore > 4", "action": "lower-lr"},)
    again = tmp_path / "again.toml"
    for config in (train_config, TrainConfig(), TrainConfig(alerts=())):
        again.write_text(recipe_toml(config, model_config), encoding="utf-8")
        assert parse_alerts(load_run_config(again)[0].alerts) == parse_alerts(config.alerts)

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
    """The final norm's output turns NaN on the given forward calls (counted from 1): a batch whose loss is not finite."""
    calls = [0]

    def hook(module, inputs, output):
        calls[0] += 1
        return output * math.nan if calls[0] in at_calls else output

    return model.norm.register_forward_hook(hook)  # the head is fused into the loss


def test_nan_batch_is_skipped(tiny_corpus, one_torch_thread):
    model, optimizer, loader, config = setup(tiny_corpus, ({"metric": "nonfinite", "condition": "nonfinite", "action": "skip-batch"},))
    poison_forward(model, {3})
    hooks, seen = recording_hooks()
    state = train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)
    assert state.step == config.max_steps and state.skipped_updates == 1
    assert [(a["kind"], a["action"], a["step"]) for a in seen["alerts"]] == [("alert", "skip-batch", 3)]
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("log_interval", [1, 4])  # 4: the NaN at step 3 is found on the device at step 4, the next host read
def test_nan_batch_stops_the_run_by_default_and_writes_its_alert_row(tiny_corpus, one_torch_thread, log_interval):
    model, optimizer, loader, config = setup(tiny_corpus, None, log_interval=log_interval)
    poison_forward(model, {3})
    hooks, seen = recording_hooks()
    with pytest.raises(TrainingStopped, match=r"'non-finite loss or gradient' fired at step 3 .*non-finite training loss"):
        train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)
    assert [(a["alert"], a["metric"], a["step"], a["action"]) for a in seen["alerts"]] == [
        ("non-finite loss or gradient", "last_loss", 3, "stop")]
    assert seen["checkpoints"] == []  # nothing after the damage is saved


def test_without_a_nonfinite_rule_a_nan_still_raises(tiny_corpus, one_torch_thread):
    model, optimizer, loader, config = setup(tiny_corpus, ({"metric": "loss", "condition": "> 100"},))
    poison_forward(model, {3})
    hooks, seen = recording_hooks()
    with pytest.raises(FloatingPointError, match="non-finite training loss nan at step 3"):
        train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)
    assert seen["alerts"] == []


def test_an_eval_alert_records_the_step_it_fired_at(tiny_corpus, one_torch_thread):
    from hymo_core.train.data import ValidationLoader

    rule = {"metric": "val_loss", "condition": "> 0", "name": "held-out loss above 0"}
    model, optimizer, loader, config = setup(tiny_corpus, (rule,), eval_interval=3, log_interval=4, max_steps=6)
    val = ValidationLoader(CorpusReader(tiny_corpus), config.seq_len, config.batch_size, max_batches=1)
    hooks, seen = recording_hooks()
    train(model, optimizer, loader, val, config, TrainState(), CPU, hooks)
    assert [a["step"] for a in seen["alerts"]] == [3, 6]


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


def test_robust_spike_rules_watch_from_the_third_log():
    spike = AlertRule("last_loss", "zscore > 6", window=20)
    assert not fires(spike, 50.0, [3.0])[0]  # one earlier value defines no spread
    assert fires(spike, 50.0, [3.0, 3.2])[0]  # two do: the third log is judged
    assert not fires(spike, 3.3, [3.0, 3.2])[0]
    # one outlier in the window moves neither the median nor the MAD: the next spike is still seen
    assert fires(spike, 9.0, [3.0, 3.1, 2.9, 40.0, 3.0])[0]
    # a flat series: its jitter is no spike (the spread is floored at 5 % of the median)
    assert not fires(spike, 3.1, [3.0, 3.0, 3.0, 3.0])[0]


def test_thresholds_may_name_the_runs_constants():
    book = AlertBook(DEFAULT_ALERTS, {"ln_vocab": math.log(8192), "tau": 100.0})
    # the sample's healthy run (max logit 0.3-2.6, loss 8.8 at step 10 under ln V = 9.01, log-Z 7.9-8.7): silent
    healthy = {"step": 10, "last_loss": 8.78, "log_z": 8.78, "max_attention_logit": 0.28, "grad_norm_pre_clip": 3.6}
    assert book.check_record(healthy) == []
    # the sample at 100x its LR, step 10 and 20: loss 13.3 and log-Z 14.6, then logits of 154
    assert {f.alert for f in book.check_record({"step": 10, "last_loss": 13.3, "log_z": 14.6, "max_attention_logit": 13.2})} == {
        "loss above ln V", "log-Z far above ln V"}
    assert "attention logits near QK-Clip's tau" in {f.alert for f in book.check_record({"step": 20, "max_attention_logit": 153.8})}
    assert AlertRule("log_z", "> ln_vocab + 3").threshold_in({"ln_vocab": 9.0}) == 12.0
    assert AlertRule("x", "> 0.5 * tau").threshold_in({"tau": 100.0}) == 50.0
    assert not fires(AlertRule("x", "> 0.5 * tau"), 1e9, [], constants={})[0]  # a run without the constant: never fires
    with pytest.raises(AlertConfigError, match="names 'vocab'"):
        parse_alerts([{"metric": "loss", "condition": "> vocab"}])


def test_book_state_round_trips_through_plain_types():
    import json

    book = AlertBook(DEFAULT_ALERTS, {"ln_vocab": 4.0, "tau": 100.0})
    for step, loss in enumerate([3.0, 3.1, 2.9, math.nan, 9.0], 1):
        book.check_record({"step": step, "last_loss": loss, "max_attention_logit": 60.0})
    state = json.loads(json.dumps(book.state_dict(), allow_nan=False))  # JSON as DCP's metadata.json holds it
    again = AlertBook(DEFAULT_ALERTS, {"ln_vocab": 4.0, "tau": 100.0})
    again.load_state_dict(state)
    assert again.history == book.history and again.evals == book.evals
    assert [f.to_record() for f in again.fired] == [f.to_record() for f in book.fired]  # NaN values compare as "nan"
    assert any(f.metric == "last_loss" and math.isnan(f.value) for f in again.fired)
    assert all(math.isfinite(v) for values in book.history.values() for v in values)
    with pytest.raises(ValueError, match="monitor.alerts is malformed"):
        again.load_state_dict({"history": {"x": ["three"]}, "evals": [], "fired": []})
    assert again.history == book.history  # a refused state changes nothing


def test_book_keeps_history_per_metric():
    book = AlertBook(parse_alerts([{"metric": "last_loss", "condition": "zscore > 3", "window": 3}]))
    for step, loss in enumerate([3.0, 3.1, 2.9, 3.0], 1):
        assert book.check_record({"kind": "train", "step": step, "last_loss": loss}) == []
    assert book.check_record({"kind": "train", "step": 5, "last_loss": 8.0}) == []  # a log-action spike waits for the next log
    firing, = book.unresolved(6)  # the run ended first: a warning
    assert firing.step == 5 and firing.action == "log" and firing.statistic > 3 and firing.severity == "warning"
    assert firing.to_record()["kind"] == "alert" and firing.to_record()["judged_at"] == 6


def test_a_spike_that_recovers_is_a_note_and_one_that_stays_warns():
    """Issue 58: the sample's 200-update run logged a gradient-norm spike at step 80 (4.70, z = 19.6) that was gone by the next log."""
    healthy = [1.4, 1.3, 1.5, 1.2, 1.35, 1.25]
    book = AlertBook(DEFAULT_ALERTS, {"ln_vocab": 9.0, "tau": 100.0})
    for step, norm in enumerate(healthy, 1):
        assert book.check_record({"step": 10 * step, "grad_norm_pre_clip": norm}) == []
    assert book.check_record({"step": 70, "grad_norm_pre_clip": 4.70}) == []  # held
    note, = book.check_record({"step": 80, "grad_norm_pre_clip": 1.3})
    assert (note.severity, note.step, note.alert, note.judged_at) == ("info", 70, "gradient-norm spike", 80)
    assert note.to_record()["kind"] == "note" and "recovered by step 80" in note.to_record()["note"]
    assert book.unresolved(80) == []
    # a spike that is still there at the next log: both are warnings
    assert book.check_record({"step": 90, "grad_norm_pre_clip": 5.0}) == []
    first, second = book.check_record({"step": 100, "grad_norm_pre_clip": 6.0})
    assert (first.severity, first.step, second.severity, second.step) == ("warning", 90, "warning", 100)
    # a held spike survives a checkpoint: a resumed book judges it as the uninterrupted one would
    import json

    assert book.check_record({"step": 110, "grad_norm_pre_clip": 9.0}) == [] and book.held
    state = json.loads(json.dumps(book.state_dict(), allow_nan=False))
    again = AlertBook(DEFAULT_ALERTS, {"ln_vocab": 9.0, "tau": 100.0})
    again.load_state_dict(state)
    assert [f.to_record() for f in again.fired] == [f.to_record() for f in book.fired]
    assert {k: f.to_record() for k, f in again.held.items()} == {k: f.to_record() for k, f in book.held.items()}


def test_spike_rules_that_act_still_act_at_once():
    book = AlertBook(parse_alerts([{"metric": "last_loss", "condition": "zscore > 3", "window": 3, "action": "lower-lr"}]))
    for step, loss in enumerate([3.0, 3.1, 2.9, 3.0], 1):
        book.check_record({"step": step, "last_loss": loss})
    firing, = book.check_record({"step": 5, "last_loss": 8.0})
    assert firing.severity == "warning" and firing.action == "lower-lr"


def test_a_recovered_spike_in_a_real_run_is_a_note_row_and_no_alert(tiny_corpus, one_torch_thread, monkeypatch):
    """A gradient-norm spike injected on one logging step of a real run (the norm the loop reads, times 20)."""
    model, optimizer, loader, config = setup(tiny_corpus, None, max_steps=12)
    hooks, seen = recording_hooks()
    original = hooks.on_log

    def spiking(record):  # the record the alerts judge: step 8's gradient norm 20x what the loop measured
        if record["step"] == 8:
            record["grad_norm_pre_clip"] *= 20
        original(record)

    hooks.on_log = spiking
    train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)
    assert [r for r in seen["alerts"] if r["kind"] == "alert"] == [], seen["alerts"]
    note, = [r for r in seen["alerts"] if r["step"] == 8]
    assert note["kind"] == "note" and note["judged_at"] == 9 and note["alert"] == "gradient-norm spike"


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


def test_the_gradient_norm_default_lets_a_healthy_drift_pass_and_still_catches_a_spike():
    """The sample's healthy 1,000-update run (bench/alert_rates.py): the 20 logged gradient norms before step 480, then step
    480's 1.478. At a 5 % spread floor that was z = 5.9, a hair from a warning; the default reads a 25 % floor."""
    window = [0.999, 1.024, 1.133, 0.886, 0.925, 0.971, 1.02, 0.937, 0.921, 1.027, 1.024, 0.954, 0.936, 1.064, 1.069, 0.876,
              0.872, 0.96, 1.415, 0.867]
    rule = next(r for r in DEFAULT_ALERTS if r.label == "gradient-norm spike")
    assert rule.spread_floor == 0.25
    fired, statistic = fires(rule, 1.478, window)
    assert not fired and statistic < 3
    assert fires(AlertRule("grad_norm_pre_clip", "zscore > 6", window=20), 1.478, window)[1] > 5.5  # the old floor: nearly
    assert fires(rule, 3.0, window)[0]  # 3x the recent median: a spike

"""Checkpoint contract: no live gradients, atomic files, every incompatible case refused without touching anything."""
from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from hymo_core.checkpoint.common import CheckpointError, list_checkpoints, weights_sha256
from hymo_core.checkpoint.single import CheckpointDirectory, load_checkpoint, save_checkpoint
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.optim import build_optimizer
from hymo_core.train.config import TrainConfig
from hymo_core.train.trainer import TrainState, train

from conftest import write_corpus

CPU = torch.device("cpu")
TINY = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
CONFIG = TrainConfig(batch_size=4, seq_len=16, max_steps=4, warmup_steps=1, horizon_steps=8, log_interval=1)


def build(corpus, model_config=TINY, config=CONFIG, freeze=None):
    torch.manual_seed(0)
    model = Transformer(model_config)
    if freeze:
        getattr(model, freeze).weight.requires_grad_(False)
    optimizer = build_optimizer(model, config.optimizer_config(CPU))
    loader = TokenLoader(CorpusReader(corpus), "train", config.seq_len, config.batch_size, config.seed)
    return model, optimizer, loader


@pytest.fixture(scope="module")
def module_corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def saved(module_corpus, tmp_path_factory):
    """A checkpoint after 4 steps, with the objects and the RNG state it captured."""
    model, optimizer, loader = build(module_corpus)
    state = train(model, optimizer, loader, None, CONFIG, TrainState(), CPU)
    torch.manual_seed(77)
    rng = torch.get_rng_state()
    path = save_checkpoint(tmp_path_factory.mktemp("ckpt") / "step-00000004.pt", model, optimizer, state, CONFIG, loader)
    return path, model, loader, optimizer, rng


@pytest.fixture
def tiny_corpus(module_corpus):
    return module_corpus


def snapshot(model, loader):
    return weights_sha256(model), loader.state_dict(), torch.get_rng_state().clone(), random.getstate(), np.random.get_state()[1].copy()


def assert_unchanged(before, after):
    assert before[0] == after[0] and before[1] == after[1] and torch.equal(before[2], after[2])
    assert before[3] == after[3] and np.array_equal(before[4], after[4])


def test_save_refuses_live_gradients(tiny_corpus, tmp_path):
    model, optimizer, loader = build(tiny_corpus)
    x, y = loader.next_batch()
    model(x, y)[1].backward()
    with pytest.raises(ValueError, match="zero_grad"):
        save_checkpoint(tmp_path / "c.pt", model, optimizer, TrainState(), CONFIG, loader)
    assert not (tmp_path / "c.pt").exists()


def test_round_trip_restores_weights_optimizer_cursor_rng(saved, tiny_corpus):
    path, trained, trained_loader, trained_optimizer, saved_rng = saved
    model, optimizer, loader = build(tiny_corpus)
    torch.manual_seed(999)
    state = load_checkpoint(path, model, optimizer, replace(CONFIG, max_steps=8), loader)
    assert state.step == 4 and state.tokens_seen == 4 * CONFIG.tokens_per_update
    assert weights_sha256(model) == weights_sha256(trained)
    assert loader.state_dict() == trained_loader.state_dict()
    ours, theirs = optimizer.state_dict()["state"], trained_optimizer.state_dict()["state"]
    assert ours.keys() == theirs.keys() and all(
        torch.equal(ours[i][k], theirs[i][k]) for i in ours for k in ours[i])
    assert torch.equal(torch.get_rng_state(), saved_rng)  # the saved RNG, not the caller's
    assert all(p.grad is None for p in model.parameters())


INCOMPATIBLE = {
    "vocab": (dict(model_config=replace(TINY, vocab_size=128)), "vocab_size"),
    "model config": (dict(model_config=replace(TINY, rope_base=500.0)), "model config differs in rope_base"),
    "optimizer layout": (dict(freeze="output"), "optimizer parameter layout"),
    "smaller max_steps": (dict(config=replace(CONFIG, max_steps=3)), "max_steps 3 is smaller"),
    "recipe": (dict(config=replace(CONFIG, peak_lr=1e-2)), "training recipe differs in peak_lr"),
    "schedule": (dict(config=replace(CONFIG, horizon_steps=0, max_steps=6)), "LR schedule differs"),
}


@pytest.mark.parametrize("case", sorted(INCOMPATIBLE))
def test_incompatible_checkpoint_refused_and_nothing_touched(saved, tiny_corpus, case):
    path = saved[0]
    kwargs, message = INCOMPATIBLE[case]
    config = kwargs.pop("config", CONFIG)
    model, optimizer, loader = build(tiny_corpus, config=config, **kwargs)
    loader.next_batch()  # a cursor that differs from the checkpoint's
    torch.manual_seed(5)
    before = snapshot(model, loader)
    optimizer_before = repr(optimizer.state_dict())
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path, model, optimizer, config, loader)
    assert_unchanged(before, snapshot(model, loader))
    assert repr(optimizer.state_dict()) == optimizer_before


def test_other_corpus_refused_by_manifest_digest(saved, tmp_path):
    other = write_corpus(tmp_path / "other", seed=1)
    model, optimizer, loader = build(other)
    before = snapshot(model, loader)
    with pytest.raises(CheckpointError, match="corpus manifest digest"):
        load_checkpoint(saved[0], model, optimizer, CONFIG, loader)
    assert_unchanged(before, snapshot(model, loader))


def test_other_thread_count_warns_and_refuses_only_when_bitwise_resume_is_asked(saved, tiny_corpus):
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        strict = replace(CONFIG, bitwise_resume=True)
        model, optimizer, loader = build(tiny_corpus, config=strict)
        before = snapshot(model, loader)
        with pytest.raises(CheckpointError, match="thread count .* bitwise_resume"):
            load_checkpoint(saved[0], model, optimizer, strict, loader)
        assert_unchanged(before, snapshot(model, loader))
        model, optimizer, loader = build(tiny_corpus)
        warnings: list[str] = []
        state = load_checkpoint(saved[0], model, optimizer, CONFIG, loader, warn=warnings.append)
        assert state.step == 4 and len(warnings) == 1 and "thread count" in warnings[0] and "not bitwise" in warnings[0]
    finally:
        torch.set_num_threads(threads)


def test_other_torch_version_warns_and_strict_resume_refuses(saved, tiny_corpus, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    model, optimizer, loader = build(tiny_corpus)
    before = snapshot(model, loader)
    with pytest.raises(CheckpointError, match="torch .* != 0.0.1 and --strict-resume is on"):
        load_checkpoint(saved[0], model, optimizer, CONFIG, loader, strict=True)
    assert_unchanged(before, snapshot(model, loader))
    warnings: list[str] = []
    state = load_checkpoint(saved[0], model, optimizer, CONFIG, loader, warn=warnings.append)
    assert state.step == 4 and len(warnings) == 1 and "!= 0.0.1" in warnings[0] and "not bitwise" in warnings[0]


def test_checkpoint_written_before_the_layout_move_still_resumes(saved, tiny_corpus, tmp_path):
    """Before the layout move the optimizers lived in hymo_core/optim.py; their checkpoints name that module."""
    path, trained, *_ = saved
    payload = torch.load(path, weights_only=True)
    assert payload["optimizer_type"] == "hymo_core.train.optim.MuonAdamW"
    payload["optimizer_type"] = "hymo_core.optim.MuonAdamW"
    old = tmp_path / "step-00000004.pt"
    torch.save(payload, old)
    model, optimizer, loader = build(tiny_corpus)
    assert load_checkpoint(old, model, optimizer, replace(CONFIG, max_steps=8), loader).step == 4
    assert weights_sha256(model) == weights_sha256(trained)
    payload["optimizer_type"] = "hymo_core.optim.SomethingElse"
    torch.save(payload, old)
    with pytest.raises(CheckpointError, match="optimizer hymo_core.optim.SomethingElse"):
        load_checkpoint(old, *build(tiny_corpus)[:2], replace(CONFIG, max_steps=8), build(tiny_corpus)[2])


def test_truncated_checkpoint_refused_and_previous_offered(saved, tiny_corpus, tmp_path):
    path = tmp_path / "step-00000004.pt"
    path.write_bytes(saved[0].read_bytes())
    later = path.with_name("step-00000006.pt")
    later.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    model, optimizer, loader = build(tiny_corpus)
    before = snapshot(model, loader)
    with pytest.raises(CheckpointError, match=r"truncated or corrupt.*previous checkpoint is .*step-00000004\.pt"):
        load_checkpoint(later, model, optimizer, CONFIG, loader)
    assert_unchanged(before, snapshot(model, loader))
    later.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(later, model, optimizer, CONFIG, loader)


def test_directory_keeps_last_k_and_best(tiny_corpus, tmp_path):
    model, optimizer, loader = build(tiny_corpus)
    directory = CheckpointDirectory(tmp_path / "ckpts", keep_last=2)
    objects = dict(model=model, optimizer=optimizer, config=CONFIG, train_loader=loader)
    for step, val in ((1, 3.0), (2, 1.0), (3, 2.0), (4, 2.5), (5, 2.2)):
        directory.save(step, val, state=TrainState(step=step), **objects)
    names = [p.name for p in list_checkpoints(directory.directory)]
    assert names == ["step-00000002.pt", "step-00000004.pt", "step-00000005.pt"]  # best (2) + last two
    assert directory.index["best"]["step"] == 2 and directory.index["latest"] == "step-00000005.pt"
    assert not list(directory.directory.glob("*.tmp"))


def test_checkpoint_bytes_do_not_depend_on_the_process_global_rngs(tiny_corpus, tmp_path):
    """Prefect's threads draw from Python's global `random` while a flow trains: the checkpoint must not store it."""
    from hymo_core.train.trainer import seed_training_rng

    files = []
    for attempt, draws in enumerate((0, 1000)):
        seed_training_rng(0)
        random.seed(attempt), np.random.seed(attempt)
        model, optimizer, loader = build(tiny_corpus)
        state = train(model, optimizer, loader, None, CONFIG, TrainState(), CPU)
        for _ in range(draws):  # what other threads of the process do meanwhile
            random.random(), np.random.rand()
        files.append(save_checkpoint(tmp_path / f"run{attempt}" / "step-00000004.pt", model, optimizer, state, CONFIG, loader).read_bytes())
    assert files[0] == files[1]


def test_a_resumed_checkpoint_saves_to_the_same_bytes(saved, tiny_corpus, tmp_path):
    """Equal content, equal bytes: a run resumed from a checkpoint holds unpickled strings where a fresh run
    holds literals, and pickle's back-references must not depend on that."""
    path = saved[0]
    model, optimizer, loader = build(tiny_corpus)
    state = load_checkpoint(path, model, optimizer, CONFIG, loader)
    again = save_checkpoint(tmp_path / "again" / path.name, model, optimizer, state, CONFIG, loader)
    assert again.read_bytes() == path.read_bytes()


def test_checkpoint_carries_the_monitor_entry_and_restores_it(saved, tiny_corpus):
    path, *_ = saved
    payload = torch.load(path, weights_only=True)  # plain types only: weights_only loading keeps working
    monitor = payload["monitor"]
    assert set(monitor) == {"alerts", "sources"} and monitor["alerts"]["history"]["last_loss"]
    model, optimizer, loader = build(tiny_corpus)
    assert load_checkpoint(path, model, optimizer, replace(CONFIG, max_steps=8), loader).monitor == monitor


def test_checkpoint_from_before_the_monitor_entry_resumes_with_it_empty(saved, tiny_corpus, tmp_path):
    path, *_ = saved
    payload = torch.load(path, weights_only=True)
    del payload["monitor"]
    old = tmp_path / "step-00000004.pt"
    torch.save(payload, old)
    warnings: list[str] = []
    model, optimizer, loader = build(tiny_corpus)
    state = load_checkpoint(old, model, optimizer, replace(CONFIG, max_steps=8), loader, warn=warnings.append)
    assert state.step == 4 and state.monitor is None
    assert any("restart from empty" in w for w in warnings)


@pytest.mark.parametrize("monitor, message", [
    ({"alerts": None}, "must be"),
    ({"alerts": {"history": {"last_loss": ["x"]}, "evals": [], "fired": []}, "sources": None}, "monitor.alerts is malformed"),
    ({"alerts": None, "sources": {"total": {"prose": -3}, "mark": [0, 4]}}, "negative counts"),
])
def test_malformed_monitor_entry_refused_before_anything_changes(saved, tiny_corpus, tmp_path, monitor, message):
    path, *_ = saved
    payload = torch.load(path, weights_only=True)
    payload["monitor"] = monitor
    bad = tmp_path / "step-00000004.pt"
    torch.save(payload, bad)
    model, optimizer, loader = build(tiny_corpus)
    before = snapshot(model, loader)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(bad, model, optimizer, replace(CONFIG, max_steps=8), loader)
    assert_unchanged(before, snapshot(model, loader))

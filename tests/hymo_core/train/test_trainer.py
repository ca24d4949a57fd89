"""The training loop's branches: non-finite loss, fp16 skips (on CPU through the explicit opt-in), QK-Clip, validation."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from hymo_core.train.data import CorpusReader, TokenLoader, ValidationLoader
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.optim import build_optimizer
from hymo_core.train.schedule import learning_rate_at_step
from hymo_core.train.config import TrainConfig
from hymo_core.train.trainer import MAX_CONSECUTIVE_SKIPS, QKClip, TrainHooks, TrainState, evaluate, train


CPU = torch.device("cpu")


def tiny_model(**overrides) -> Transformer:
    torch.manual_seed(0)
    values = dict(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
    values.update(overrides)
    return Transformer(ModelConfig(**values))


def setup(corpus, **config_overrides):
    values = dict(batch_size=4, seq_len=16, max_steps=3, warmup_steps=1, log_interval=1, eval_interval=100, checkpoint_interval=100)
    values.update(config_overrides)
    config = TrainConfig(**values)
    model = tiny_model()
    optimizer = build_optimizer(model, config.optimizer_config(CPU))
    loader = TokenLoader(CorpusReader(corpus), "train", config.seq_len, config.batch_size, config.seed)
    return model, optimizer, loader, config


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="horizon_steps"):
        TrainConfig(max_steps=5, warmup_steps=10)
    with pytest.raises(ValueError, match="unknown TrainConfig keys"):
        TrainConfig.from_dict({"batch_sise": 3})


def test_setup_refuses_cpu_fp16_and_non_fp32_weights(tiny_corpus):
    model, optimizer, loader, config = setup(tiny_corpus, precision="fp16")
    with pytest.raises(ValueError, match="fp16 training is refused on CPU"):
        train(model, optimizer, loader, None, config, TrainState(), CPU)
    model, optimizer, loader, config = setup(tiny_corpus, precision="bf16")
    model.to(torch.bfloat16)
    with pytest.raises(ValueError, match="master weights must be fp32"):
        train(model, optimizer, loader, None, config, TrainState(), CPU)


def test_non_finite_loss_raises_before_backward(tiny_corpus):
    model, optimizer, loader, config = setup(tiny_corpus)
    with torch.no_grad():
        model.norm.weight.fill_(float("nan"))
    state = TrainState()
    with pytest.raises(FloatingPointError, match="non-finite training loss"):
        train(model, optimizer, loader, None, config, state, CPU)
    assert all(p.grad is None for p in model.parameters())  # backward never ran
    assert state.tokens_seen == 0 and state.step == 0


def test_fp16_skips_keep_step_and_schedule_and_count_tokens(tiny_corpus):
    # 2**24 overflows fp16 activation gradients: the first attempts are skipped, then the scale settles.
    model, optimizer, loader, config = setup(tiny_corpus, precision="fp16", allow_cpu_fp16=True, fp16_init_scale=2.0**24,
                                             max_steps=3, schedule="cosine")
    updates, events, timeline = [], [], []
    hooks = TrainHooks(on_update=lambda s, loss, lr: (updates.append((s.step, lr)), timeline.append(("update", s.step))),
                       on_event=lambda e: (events.append(e), timeline.append(("skip", e["step"]))))
    state = train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)
    assert state.step == 3
    assert state.skipped_updates >= 1 and len(events) == state.skipped_updates
    # a skip retries the same candidate step: the next successful update carries the skipped step's number
    for (kind, step), (_, following) in zip(timeline, timeline[1:]):
        if kind == "skip":
            assert following == step
    assert state.tokens_seen == (state.step + state.skipped_updates) * config.tokens_per_update
    assert updates == [(s, learning_rate_at_step(config.schedule_config(), s)) for s in (1, 2, 3)]
    assert state.grad_scaler_state["scale"] < 2.0**24


def test_consecutive_fp16_skips_raise_and_never_mutate_weights(tiny_corpus):
    # A scale no fp16 gradient survives; a tiny QK-Clip threshold would rescale heads after any real update.
    model, optimizer, loader, config = setup(tiny_corpus, precision="fp16", allow_cpu_fp16=True, fp16_init_scale=2.0**100,
                                             qk_clip_threshold=1e-6)
    before = weights(model)
    state = TrainState()
    with pytest.raises(FloatingPointError, match=f"{MAX_CONSECUTIVE_SKIPS} consecutive"):
        train(model, optimizer, loader, None, config, state, CPU)
    assert state.skipped_updates == MAX_CONSECUTIVE_SKIPS and state.step == 0
    assert state.tokens_seen == MAX_CONSECUTIVE_SKIPS * config.tokens_per_update
    after = weights(model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # no optimizer step, no QK-Clip after a skip


def test_qk_clip_rescales_only_heads_over_threshold():
    model = tiny_model(n_heads=4, n_kv_heads=4, d_model=32)
    before = weights(model)
    clip = QKClip(model, threshold=10.0, enabled=True)
    clip.maxima_LH = torch.tensor([[40.0, 5.0, 10.0, 12.5]])
    assert clip.apply() == 2
    d = model.config.head_dim
    q, k = model.layers[0].attn.q_proj.weight, model.layers[0].attn.k_proj.weight
    for head, gamma in ((0, 10 / 40), (1, 1.0), (2, 1.0), (3, 10 / 12.5)):
        rows = slice(head * d, (head + 1) * d)
        torch.testing.assert_close(q[rows], before["layers.0.attn.q_proj.weight"][rows] * math.sqrt(gamma))
        torch.testing.assert_close(k[rows], before["layers.0.attn.k_proj.weight"][rows] * math.sqrt(gamma))
    # the clipped head's logit is now exactly at the threshold: logits scale with q and k
    x = torch.randint(0, 64, (2, 16))
    model.set_attention_probe(True)
    model(x)
    scaled = model.attention_max_logits()[0]
    model.load_state_dict(before)
    model(x)
    original = model.attention_max_logits()[0]
    torch.testing.assert_close(scaled[0], original[0] * 10 / 40)
    torch.testing.assert_close(scaled[1], original[1])


def test_qk_clip_under_gqa_scales_queries_only():
    model = tiny_model(n_heads=4, n_kv_heads=2)
    before = weights(model)
    clip = QKClip(model, threshold=10.0, enabled=True)
    clip.maxima_LH = torch.tensor([[20.0, 1.0, 1.0, 1.0]])
    clip.apply()
    d = model.config.head_dim
    torch.testing.assert_close(model.layers[0].attn.q_proj.weight[:d], before["layers.0.attn.q_proj.weight"][:d] * 0.5)
    assert torch.equal(model.layers[0].attn.q_proj.weight[d:], before["layers.0.attn.q_proj.weight"][d:])
    assert torch.equal(model.layers[0].attn.k_proj.weight, before["layers.0.attn.k_proj.weight"])


def test_qk_clip_validate_refuses_non_finite_observations():
    clip = QKClip(tiny_model(), threshold=10.0, enabled=True)
    clip.maxima_LH = torch.tensor([[1.0, float("inf")]])
    with pytest.raises(FloatingPointError):
        clip.validate()


def test_qk_clip_in_the_loop_bounds_the_logit(tiny_corpus):
    finals = {}
    for enabled in (False, True):
        model, optimizer, loader, config = setup(tiny_corpus, qk_clip=enabled, qk_clip_threshold=1e-4, max_steps=2)
        logs = []
        train(model, optimizer, loader, None, config, TrainState(), CPU, TrainHooks(on_log=logs.append))
        assert all((r["qk_clipped_heads"] > 0) == enabled for r in logs)  # init logits (~1e-3) exceed 1e-4
        x, _ = loader.next_batch()
        model.set_attention_probe(True)
        model(x)
        finals[enabled] = float(model.attention_max_logits().max())
    assert finals[True] < finals[False] / 3


def test_evaluate_restores_mode_and_rng_even_on_failure(tiny_corpus):
    corpus = CorpusReader(tiny_corpus)
    model = tiny_model()
    model.train()
    val = ValidationLoader(corpus, seq_len=16, batch_size=4, max_batches=2)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    first = evaluate(model, val, CPU)
    assert model.training and first == evaluate(model, val, CPU)  # fixed prefix, from offset 0 each time
    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(1), expected[2])

    class Broken:
        def __len__(self):
            return 2

        def batch(self, index):
            if index:
                raise RuntimeError("disk went away")
            return val.batch(0)

    torch.manual_seed(2)
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="disk went away"):
        evaluate(model, Broken(), CPU)
    assert model.training and torch.equal(torch.get_rng_state(), rng)


def test_loss_falls_and_intervals_fire_on_final_step(tiny_corpus):
    model, optimizer, loader, config = setup(tiny_corpus, max_steps=25, warmup_steps=3, peak_lr=1e-2, log_interval=10,
                                             eval_interval=10, checkpoint_interval=20)
    val = ValidationLoader(CorpusReader(tiny_corpus), seq_len=16, batch_size=4, max_batches=2)
    logs, evals, saves = [], [], []
    hooks = TrainHooks(on_log=logs.append, on_eval=lambda s, v: evals.append((s, v["val_loss"])),
                       on_checkpoint=lambda s: saves.append(s.step))
    state = train(model, optimizer, loader, val, config, TrainState(), CPU, hooks)
    assert [r["step"] for r in logs] == [10, 20, 25] and [s for s, _ in evals] == [10, 20, 25] and saves == [20, 25]
    assert evals[-1][1] < math.log(64) - 0.5
    assert state.best_val_loss == min(v for _, v in evals)
    record = logs[-1]
    assert set(record["lr"]) == {"muon", "adamw", "adamw_no_decay"} and record["tokens_per_s"] > 0 and record["max_attention_logit"] > 0


def test_overfit_mode_rereads_one_batch_without_moving_the_cursor(tiny_corpus):
    model, optimizer, loader, config = setup(tiny_corpus, overfit_one_batch=True, max_steps=12, peak_lr=1e-2, warmup_steps=2)
    loader.next_batch()  # the fixed batch is the one at the cursor when training starts
    expected = loader.state_dict()
    losses = []
    state = train(model, optimizer, loader, None, config, TrainState(), CPU, TrainHooks(on_update=lambda s, loss, lr: losses.append(float(loss))))
    assert state.fixed_batch_offset == config.batch_size and loader.state_dict() == expected
    assert losses[-1] < losses[0] - 1.0


def test_training_core_imports_no_pipeline_and_no_prefect():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, hymo_core.train.run, hymo_core.checkpoint.single, hymo_core.eval.evaluation; "
            "bad = sorted({m.split('.')[0] for m in sys.modules} & {'prefect', 'tasks', 'flows', 'manifests'}); "
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

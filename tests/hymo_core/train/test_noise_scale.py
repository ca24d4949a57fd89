"""The two-batch noise-scale estimator: unbiased on gradients of known noise, and fed by the trainer's own norms."""
from __future__ import annotations

import copy

import pytest
import torch

from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.config import TrainConfig
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.train.noise_scale import NoiseScale, gradient_square_norm, two_batch_estimates
from hymo_core.train.optim import build_optimizer
from hymo_core.train.trainer import TrainHooks, TrainState, train

CPU = torch.device("cpu")


def test_estimates_recover_the_true_gradient_and_noise_of_a_known_distribution():
    # Per-token gradients g = G + e, e ~ N(0, diag(sigma^2)): |G|^2 and tr(Sigma) are known exactly.
    generator = torch.Generator().manual_seed(0)
    dim, b_small, b_big, trials = 64, 8, 64, 400
    true_G = torch.randn(dim, generator=generator) * 0.1
    sigma = torch.rand(dim, generator=generator) + 0.5
    estimator = NoiseScale(decay=1 - 1 / trials)  # nearly a plain mean over the trials
    true_sq, trace = [], []
    for _ in range(trials):
        tokens = true_G + sigma * torch.randn(b_big, dim, generator=generator)
        small_sq = float(tokens[:b_small].mean(0).square().sum())  # the first micro-batch's mean gradient
        big_sq = float(tokens.mean(0).square().sum())  # the accumulated one (it contains the first)
        g, s = two_batch_estimates(small_sq, big_sq, b_small, b_big)
        true_sq.append(g), trace.append(s)
        record = estimator.add(small_sq, big_sq, b_small, b_big)
    expected_G, expected_trace = float(true_G.square().sum()), float(sigma.square().sum())
    assert sum(trace) / trials == pytest.approx(expected_trace, rel=0.05)
    assert sum(true_sq) / trials == pytest.approx(expected_G, abs=0.15 * expected_G)
    assert record["b_simple_tokens"] == pytest.approx(expected_trace / expected_G, rel=0.2)
    # A single pair is unusable on its own: its |G|^2 estimate goes negative in some trials.
    assert min(true_sq) < 0 < expected_G


def test_estimator_rejects_batches_it_cannot_compare():
    with pytest.raises(ValueError, match="b_small < b_big"):
        two_batch_estimates(1.0, 0.5, 64, 64)


def tiny_run(corpus, **overrides):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16))
    config = TrainConfig(**{**dict(batch_size=2, seq_len=16, max_steps=1, warmup_steps=0, log_interval=1, eval_interval=100,
                                   checkpoint_interval=100), **overrides})
    loader = TokenLoader(CorpusReader(corpus), "train", config.seq_len, config.batch_size, config.seed)
    return model, config, loader


def test_trainer_logs_the_first_micro_batch_and_update_norms(tiny_corpus):
    model, config, loader = tiny_run(tiny_corpus, max_steps=2, gradient_accumulation_steps=3)
    reference, first_batch = copy.deepcopy(model), copy.deepcopy(loader)
    logs: list[dict] = []
    train(model, build_optimizer(model, config.optimizer_config(CPU)), loader, None, config, TrainState(), CPU,
          TrainHooks(on_log=logs.append))
    noise = logs[0]["noise_scale"]
    assert (noise["b_small_tokens"], noise["b_big_tokens"]) == (2 * 16, 3 * 2 * 16)
    assert noise["grad_sq_big"] == pytest.approx(logs[0]["grad_norm_pre_clip"] ** 2, rel=1e-5)
    # Step 1's first micro-batch on the initial weights, recomputed apart: the same |grad|^2.
    x, y = first_batch.next_batch()
    reference(x, y)[1].backward()
    assert noise["grad_sq_small"] == pytest.approx(float(gradient_square_norm(reference)), rel=1e-4)
    assert noise["grad_sq_small"] > noise["grad_sq_big"]  # one micro-batch is noisier than three
    assert logs[1]["noise_scale"]["b_simple_tokens"] > 0  # the running estimate after two logged steps


def test_no_estimate_without_accumulation(tiny_corpus):
    model, config, loader = tiny_run(tiny_corpus)
    logs: list[dict] = []
    train(model, build_optimizer(model, config.optimizer_config(CPU)), loader, None, config, TrainState(), CPU,
          TrainHooks(on_log=logs.append))
    assert "noise_scale" not in logs[0]

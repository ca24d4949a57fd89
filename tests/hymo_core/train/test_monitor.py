"""The seed's signals at log_interval, measured on a real corpus with shard indexes (the tiny pipeline run)."""
from __future__ import annotations

import math

import torch

from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.config import TrainConfig
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.train.monitor import PEAK_FLOPS_ENV, stated_peak_flops
from hymo_core.train.optim import build_optimizer
from hymo_core.train.trainer import TrainHooks, TrainState, train

CPU = torch.device("cpu")


def run(corpus, **overrides):
    reader = CorpusReader(corpus)
    values = dict(batch_size=4, seq_len=16, max_steps=6, warmup_steps=1, log_interval=3, eval_interval=100, checkpoint_interval=100)
    values.update(overrides)
    config = TrainConfig(**values)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=reader.vocab_size, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16))
    optimizer = build_optimizer(model, config.optimizer_config(CPU))
    loader = TokenLoader(reader, "train", config.seq_len, config.batch_size, config.seed)
    logs = []
    train(model, optimizer, loader, None, config, TrainState(), CPU, TrainHooks(on_log=logs.append))
    return model, optimizer, logs, config


def test_logged_signals(tiny_run, one_torch_thread):
    model, optimizer, logs, config = run(tiny_run / "07_shards", max_grad_norm=1e-3)
    assert [r["step"] for r in logs] == [3, 6]
    record = logs[-1]
    groups = {g["group"] for g in optimizer.param_groups}
    assert set(record["update_rms_ratio"]) == groups and all(0 < v < 1 for v in record["update_rms_ratio"].values())
    assert record["clip_fraction"] == 1.0  # every update's norm exceeded 1e-3
    assert math.isfinite(record["log_z"]) and record["log_z"] > 0
    assert set(record["activation_rms"]) == {"block_0", "block_1"} and all(v > 0 for v in record["activation_rms"].values())
    assert record["peak_memory_bytes"] > 0 and record["peak_memory_kind"] == "process_peak_rss"
    assert 0 <= record["data_wait_s"] <= record["data_wait_s"] + record["compute_s"]
    assert record["mfu"] is None and PEAK_FLOPS_ENV in record["mfu_reference"]  # no stated peak for a CPU
    # Three updates of 4 windows x 16 targets since the previous logging step, all credited to a source.
    assert sum(record["tokens_per_source"].values()) == 3 * 4 * 16
    assert set(record["tokens_per_source"]) <= {"prose", "mixed"}
    assert sum(record["tokens_per_source_total"].values()) == 6 * 4 * 16
    assert record["documents_per_window"] >= 1
    # Hooks exist on logging steps only: none is left behind.
    assert all(not block._forward_hooks for block in model.layers) and not model._forward_hooks


def test_log_z_is_the_trunk_heads_log_partition_though_the_head_is_fused_into_the_loss():
    """The head never makes its logits in training (kernels/linear_cross_entropy.py), so log-Z comes from the rows'
    log-partitions the fused loss computes anyway: equal to logsumexp over the logits a plain head would make."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=32, max_seq_len=8))
    tokens = torch.randint(0, 64, (2, 8))
    assert model(tokens, tokens)[0] is None  # fused: no logits
    fused = model.last_lse
    logits, _ = model(tokens, tokens, return_logits=True)
    torch.testing.assert_close(fused, torch.logsumexp(logits.float(), dim=-1).reshape(-1))


def test_unlogged_clip_fraction_counts_every_update(tiny_run, one_torch_thread):
    _, _, logs, _ = run(tiny_run / "07_shards", max_grad_norm=1e6)
    assert logs[-1]["clip_fraction"] == 0.0


def test_mfu_uses_the_stated_peak(monkeypatch):
    monkeypatch.setenv(PEAK_FLOPS_ENV, "1e12")
    assert stated_peak_flops(CPU, "fp32") == (1e12, f"${PEAK_FLOPS_ENV}")


def test_mfu_flops_are_the_seeds_convention_shared_with_the_planner_and_the_gpu_check():
    """One convention (planner.FLOP_CONVENTION): 6 per matmul weight + 6 L d T for causal attention, the
    same call in the trainer's MFU and bench/gpu_check.py; MoE counts its active experts only."""
    from dataclasses import replace

    from hymo_core.models.init import build_on_meta
    from hymo_core.models.presets import PRESETS
    from hymo_core.planner import planner
    from hymo_core.train.monitor import model_flops_per_token

    dense = ModelConfig(vocab_size=512, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=160, max_seq_len=128,
                        tie_embeddings=False)
    model = build_on_meta(dense, seed=0)
    matmul = sum(p.numel() for name, p in model.named_parameters() if "tok_embeddings" not in name)
    assert model_flops_per_token(model, 128) == 6 * matmul + 6 * 3 * 64 * 128  # seed module 8, Lab 4: 6 L d T
    assert "6 L d T" in planner.FLOP_CONVENTION
    moe = replace(dense, moe_on="A", moe_n_routed_experts=8, moe_n_activated_experts=1, moe_n_shared_experts=0,
                  moe_expert_dim=160)
    for config in (dense, moe, PRESETS["hymo-tiny"]):
        expected = planner.training_flops_per_token(planner.model_shape(config), 128)
        assert model_flops_per_token(build_on_meta(config, seed=0), 128) == expected
    all_experts = 6 * planner.count_parameters(planner.model_shape(moe)).total
    assert planner.training_flops_per_token(planner.model_shape(moe), 128) < all_experts / 2  # 1 of 8 experts active

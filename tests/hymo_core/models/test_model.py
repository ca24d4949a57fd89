"""Decoder: parameter counts, loss contract, causality, GQA, RoPE, probe, init."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hymo_core.models.model import ModelConfig, Transformer, count_parameters

REPO_ROOT = Path(__file__).resolve().parents[3]
TINY = dict(vocab_size=101, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=80, max_seq_len=24)


def tiny(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**TINY, **overrides}))


def built_count(model: Transformer) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors counted once


def test_lab2_shape_counts_5_795_072_and_builds_to_it():
    config = ModelConfig()  # the defaults are Lab 2's model
    assert count_parameters(config) == 5_795_072
    assert built_count(Transformer(config)) == 5_795_072


def test_lab4_case_study_and_llama3_counts():
    case = ModelConfig(vocab_size=152064, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8,
                       ffn_dim=15360, tie_embeddings=False)
    llama3 = ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                         ffn_dim=14336, tie_embeddings=False)
    assert count_parameters(case) == 9_550_729_216
    assert count_parameters(llama3) == 8_030_261_248


@pytest.mark.parametrize("overrides", [{}, dict(tie_embeddings=False), dict(qk_norm=True),
                                       dict(n_kv_heads=6, qk_norm=True, tie_embeddings=False)])
def test_count_parameters_equals_built_model(overrides):
    model = tiny(**overrides)
    assert built_count(model) == count_parameters(model.config)


def test_tied_embeddings_share_one_tensor():
    model = tiny()
    assert model.output.weight is model.tok_embeddings.weight
    assert tiny(tie_embeddings=False).output.weight is not tiny(tie_embeddings=False).tok_embeddings.weight


def test_forward_contract_and_loss_is_mean_token_cross_entropy():
    model = tiny()
    tokens = torch.randint(0, 101, (3, 17))
    targets = torch.randint(0, 101, (3, 17))
    logits, loss = model(tokens, targets, return_logits=True)
    assert logits.shape == (3, 17, 101)
    expected = F.cross_entropy(logits.reshape(-1, 101), targets.reshape(-1))
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(model.last_ce, expected)
    logits_only, no_loss = model(tokens)
    assert no_loss is None
    torch.testing.assert_close(logits_only, logits)


def test_z_loss_adds_mean_squared_log_normaliser_and_ce_is_reported_apart():
    model = tiny(z_loss=1e-3)
    tokens, targets = torch.randint(0, 101, (2, 11)), torch.randint(0, 101, (2, 11))
    logits, loss = model(tokens, targets, return_logits=True)
    flat = logits.reshape(-1, 101).double()
    ce = F.cross_entropy(flat, targets.reshape(-1))
    lse = torch.logsumexp(flat, dim=-1)
    torch.testing.assert_close(loss.double(), ce + 1e-3 * lse.square().mean(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model.last_ce.double(), ce, rtol=1e-6, atol=1e-6)
    assert loss.item() > model.last_ce.item()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_ignored_targets_do_not_count():
    model = tiny(z_loss=1e-3)
    tokens = torch.randint(0, 101, (2, 9))
    targets = torch.randint(0, 101, (2, 9))
    _, full = model(tokens, targets)
    masked = targets.clone()
    masked[:, 5:] = -100
    _, partial = model(tokens, masked)
    logits, _ = model(tokens)
    keep = logits[:, :5].reshape(-1, 101).double()
    expected = F.cross_entropy(keep, targets[:, :5].reshape(-1)) + 1e-3 * torch.logsumexp(keep, -1).square().mean()
    torch.testing.assert_close(partial.double(), expected, rtol=1e-6, atol=1e-6)
    assert not torch.isclose(partial, full)


def test_attention_is_causal():
    model = tiny()
    tokens = torch.randint(0, 101, (2, 16))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 101
    before, _ = model(tokens)
    after, _ = model(changed)
    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_grouped_query_attention_equals_repeated_kv_heads():
    """GQA with K kv heads == full MHA whose k/v heads are the K heads repeated."""
    torch.manual_seed(1)
    gqa = tiny(n_kv_heads=2)
    mha = Transformer(ModelConfig(**{**TINY, "n_kv_heads": 6}))
    state = gqa.state_dict()
    repeat = 6 // 2
    for key, value in list(state.items()):
        if key.endswith(("k_proj.weight", "v_proj.weight")):
            heads = value.view(2, 8, 48).repeat_interleave(repeat, dim=0)
            state[key] = heads.reshape(6 * 8, 48)
    mha.load_state_dict(state)
    tokens = torch.randint(0, 101, (2, 13))
    torch.testing.assert_close(gqa(tokens)[0], mha(tokens)[0], rtol=1e-5, atol=1e-5)


def test_rope_makes_scores_depend_on_relative_position_only():
    from hymo_core.kernels import apply_rope, rope_tables

    cos, sin = rope_tables(64, 16, 10000.0)
    q = torch.randn(1, 1, 1, 16).expand(1, 64, 1, 16)
    k = torch.randn(1, 1, 1, 16).expand(1, 64, 1, 16)
    q_rot, k_rot = apply_rope(q, cos, sin)[0, :, 0], apply_rope(k, cos, sin)[0, :, 0]
    score = lambda i, j: (q_rot[i] * k_rot[j]).sum()  # noqa: E731
    torch.testing.assert_close(score(5, 2), score(40, 37), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(score(9, 9), score(63, 63), rtol=1e-4, atol=1e-5)
    assert not torch.isclose(score(5, 2), score(5, 4))
    torch.testing.assert_close(q_rot.norm(dim=-1), q[0, :, 0].norm(dim=-1))  # a rotation


def test_attention_probe_matches_definition_and_changes_nothing():
    model = tiny(qk_norm=True)
    tokens, targets = torch.randint(0, 101, (2, 12)), torch.randint(0, 101, (2, 12))
    logits, loss = model(tokens, targets, return_logits=True)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_attention_probe(True)
    probed_logits, probed_loss = model(tokens, targets, return_logits=True)
    probed_loss.backward()
    assert torch.equal(logits, probed_logits) and torch.equal(loss, probed_loss)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))

    maxima = model.attention_max_logits()
    assert maxima.shape == (2, 6)
    # Recompute layer 0's per-head maximum from scratch.
    attn, block = model.layers[0].attn, model.layers[0]
    from hymo_core.kernels import apply_rope

    x = block.attn_norm(model.tok_embeddings(tokens))
    q = attn.q_norm(attn.q_proj(x).view(2, 12, 6, 8))
    k = attn.k_norm(attn.k_proj(x).view(2, 12, 2, 8))
    q = apply_rope(q, model.rope_cos_TD2, model.rope_sin_TD2).transpose(1, 2)
    k = apply_rope(k, model.rope_cos_TD2, model.rope_sin_TD2).transpose(1, 2).repeat_interleave(3, dim=1)
    scores = (q @ k.transpose(-2, -1)).abs() / math.sqrt(8)
    visible = torch.ones(12, 12, dtype=torch.bool).tril()
    expected = scores.masked_fill(~visible, 0).amax(dim=(0, 2, 3))
    torch.testing.assert_close(maxima[0], expected.detach())
    # Future positions must not leak into the maximum.
    assert (maxima[0] <= scores.amax(dim=(0, 2, 3)) + 1e-6).all()

    model.set_attention_probe(False)
    with pytest.raises(RuntimeError):
        model.attention_max_logits()


def test_residual_projections_use_scaled_init():
    torch.manual_seed(0)
    model = Transformer(ModelConfig())  # Lab 2 shape: 256x256 and 256x688 matrices
    residual = 0.02 / math.sqrt(2 * 6)
    assert model.layers[3].attn.o_proj.weight.std().item() == pytest.approx(residual, rel=0.03)
    assert model.layers[3].ffn.down_proj.weight.std().item() == pytest.approx(residual, rel=0.03)
    assert model.layers[3].attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert model.tok_embeddings.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert torch.equal(model.norm.weight, torch.ones(256))


def test_rope_tables_are_not_checkpointed_and_too_long_input_is_rejected():
    model = tiny()
    assert not any("rope" in key for key in model.state_dict())
    with pytest.raises(ValueError):
        model(torch.zeros(1, 25, dtype=torch.long))


def test_config_validation():
    with pytest.raises(ValueError):
        ModelConfig(d_model=48, n_heads=5)
    with pytest.raises(ValueError):
        ModelConfig(d_model=48, n_heads=6, n_kv_heads=4)
    with pytest.raises(ValueError):
        ModelConfig(d_model=18, n_heads=6, n_kv_heads=6)  # odd head_dim


def test_a_few_steps_reduce_the_loss_on_a_fixed_batch():
    from hymo_core.train.optim import build_optimizer
    from hymo_core.train.optim_config import OptimizerConfig

    model = tiny()
    # fp32 Newton-Schulz: bf16 matmuls are emulated (slow) on CPUs without native bf16.
    optimizer = build_optimizer(model, OptimizerConfig(lr=3e-3, ns_dtype="float32"))
    tokens = torch.randint(0, 101, (4, 16))
    losses = []
    for _ in range(8):
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_imports_and_runs_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, hymo_core.models.model as m, hymo_core.kernels as k\n"
        "assert not k.HAVE_TRITON\n"
        "model = m.Transformer(m.ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4,"
        " ffn_dim=64, max_seq_len=8))\n"
        "_, loss = model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))\n"
        "loss.backward()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO_ROOT)

"""Gated delta rule: the chunked PyTorch form against the token-by-token oracle and fla's naive code.

fp32: outputs, final state and the gradients of q, k, v, g, beta and the initial state
agree within 1e-4 of the largest magnitude. fp16 inputs (math still fp32 inside): within
2e-3, the half-precision rounding of the inputs and output. The Triton kernel's copy of
these checks runs under the interpreter in test_kernels.py.
"""

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hymo_core.kernels.gdn import gated_delta_rule
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.optim import MUON_ADAMW_GROUPS
from hymo_core.train.partition import partition_parameters


def fla_naive():
    """fla's pure-PyTorch reference, loaded from its file: importing the fla package costs ~20 s of Triton setup."""
    spec = importlib.util.find_spec("fla")
    assert spec is not None, "flash-linear-attention's fla-core is a [test] dependency"
    path = Path(spec.submodule_search_locations[0]) / "ops" / "gated_delta_rule" / "naive.py"
    module_spec = importlib.util.spec_from_file_location("fla_gdn_naive", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.naive_recurrent_gated_delta_rule


def gdn_inputs(B, T, H, K, V, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g)
    k = F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    v = torch.randn(B, T, H, V, generator=g)
    log_decay = F.logsigmoid(torch.randn(B, T, H, generator=g) + 2)
    beta = torch.rand(B, T, H, generator=g)
    h0 = torch.randn(B, H, K, V, generator=g)
    return [q.to(dtype), k.to(dtype), v.to(dtype), log_decay, beta, h0]


def run(backend, inputs, with_state=True):
    """Output, final state and all input gradients of a fixed scalar objective."""
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    o, ht = gated_delta_rule(*xs[:5], initial_state_BHKV=xs[5] if with_state else None, backend=backend)
    weight = torch.linspace(-1, 1, ht.numel()).view_as(ht)
    (o.float().square().sum() + (ht * weight).sum()).backward()
    return [o.detach().float(), ht.detach()] + [x.grad.float() for x in (xs if with_state else xs[:5])]


def assert_agree(actual, expected, rel):
    names = ["o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"]
    for name, a, e in zip(names, actual, expected):
        err = float((a - e).abs().max() / e.abs().max().clamp(min=1e-6))
        assert err <= rel, f"{name}: relative error {err:.2e} > {rel:.0e}"


@pytest.mark.parametrize("B, T, H, K, V, with_state", [
    (2, 1, 2, 8, 16, True),     # a single token
    (1, 83, 3, 16, 8, True),    # odd length: one full chunk and a ragged tail, three heads
    (2, 64, 1, 8, 8, False),    # exactly one chunk, zero initial state
])
def test_chunked_matches_recurrent_fp32(B, T, H, K, V, with_state):
    inputs = gdn_inputs(B, T, H, K, V)
    assert_agree(run("reference", inputs, with_state), run("recurrent", inputs, with_state), 1e-4)


def test_recurrent_matches_fla_naive_reference():
    q, k, v, g, beta, h0 = gdn_inputs(2, 37, 2, 16, 16)
    o, ht = gated_delta_rule(q, k, v, g, beta, initial_state_BHKV=h0, backend="recurrent")
    o_fla, ht_fla = fla_naive()(q, k, v, beta, g, scale=16 ** -0.5, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, o_fla.to(o.dtype), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ht, ht_fla.float(), rtol=1e-5, atol=1e-5)


def test_chunked_fp16_inputs_within_half_precision():
    inputs = gdn_inputs(1, 70, 2, 16, 16, dtype=torch.float16)
    assert_agree(run("reference", inputs), run("recurrent", inputs), 2e-3)


def test_state_carried_across_calls_equals_one_call():
    """Chunked prefill / generation: splitting the sequence anywhere and passing the state on is exact."""
    q, k, v, g, beta, h0 = gdn_inputs(1, 90, 2, 8, 8)
    o_full, h_full = gated_delta_rule(q, k, v, g, beta, initial_state_BHKV=h0)
    o_a, h_a = gated_delta_rule(q[:, :41], k[:, :41], v[:, :41], g[:, :41], beta[:, :41], initial_state_BHKV=h0)
    o_b, h_b = gated_delta_rule(q[:, 41:], k[:, 41:], v[:, 41:], g[:, 41:], beta[:, 41:], initial_state_BHKV=h_a)
    torch.testing.assert_close(torch.cat((o_a, o_b), 1), o_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h_b, h_full, rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_refused():
    q, k, v, g, beta, h0 = gdn_inputs(1, 5, 2, 8, 8)
    with pytest.raises(ValueError, match="disagree"):
        gated_delta_rule(q, k[:, :4], v, g, beta)
    with pytest.raises(ValueError, match="initial state"):
        gated_delta_rule(q, k, v, g, beta, initial_state_BHKV=h0[:, :1])


def test_gdn_scalars_go_to_adamw_by_name():
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=32,
                                    max_seq_len=16, layer_pattern="G"))
    groups = {assignment.name: assignment.group for assignment, _ in partition_parameters(model.named_parameters(),
                                                                                             MUON_ADAMW_GROUPS)}
    assert groups["layers.0.attn.A_log"] == groups["layers.0.attn.dt_bias"] == "adamw_no_decay"
    assert groups["layers.0.attn.q_proj.weight"] == groups["layers.0.attn.o_proj.weight"] == "muon"
    assert groups["layers.0.attn.q_conv1d.weight"] == "adamw_no_decay"  # 3-D conv weight: no decay

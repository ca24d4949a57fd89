"""GDN's fused short convolution (kernels/causal_conv1d.py): the Triton kernels against the PyTorch reference.

Forward (q, k, v) and backward (the input's and the three weights' gradients) on small odd shapes: T not a
multiple of the time tile, head widths that are not powers of two, v wider and narrower than a channel
block, a conv of 3 and 4 taps, the input a strided view as the projection's split gives it, with and
without a cache's tail. Without a GPU the kernels run under TRITON_INTERPRET=1 in a child pytest
(interpreter_child.py). fp32 within 1e-5; fp16 against the reference computed in fp32 on the same fp16
inputs, within half-precision rounding.
"""

import pytest
import torch

pytest.importorskip("triton")

from interpreter_child import RUN_HERE, run_module_in_interpreter  # noqa: E402

from hymo_core.kernels.causal_conv1d import causal_conv1d_qkv, causal_conv1d_qkv_reference  # noqa: E402

# (B, T, H, K, V, W, tail)
SHAPES = [(2, 37, 2, 16, 32, 4, False), (1, 70, 3, 12, 20, 3, True), (3, 5, 1, 8, 4, 4, True), (1, 1, 2, 8, 16, 4, True)]


@pytest.mark.skipif(RUN_HERE, reason="kernels run in this process")
def test_causal_conv1d_under_triton_interpreter_in_a_child_process():
    run_module_in_interpreter(__file__)


@pytest.fixture(scope="module")
def device():
    if not RUN_HERE:
        pytest.skip("run by test_causal_conv1d_under_triton_interpreter_in_a_child_process")
    return "cuda" if torch.cuda.is_available() else "cpu"


def inputs(B, T, H, K, V, W, tail, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    C = 2 * H * K + H * V
    x = torch.randn(B, T, C + 7, generator=g)[..., 3:C + 3]  # a strided view, as the fused projection's split
    weights = [torch.randn(n, 1, W, generator=g) * 0.6 for n in (H * K, H * K, H * V)]
    tail_BCW = torch.randn(B, C, W - 1, generator=g) if tail else None
    to = dict(device=device, dtype=dtype)
    return x.to(**to), [w.to(**to) for w in weights], tail_BCW.to(**to) if tail else None


def run(backend, x, weights, tail, K, upstream_seed=1):
    """Outputs and gradients (x, then each weight) of one call, with a fixed random upstream gradient."""
    x = x.detach().clone().requires_grad_()
    weights = [w.detach().clone().requires_grad_() for w in weights]
    outs = causal_conv1d_qkv(x, *weights, K, tail, backend=backend)
    g = torch.Generator().manual_seed(upstream_seed)
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=g).to(o) for o in outs])
    return list(outs) + [x.grad] + [w.grad for w in weights]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"B{s[0]}T{s[1]}H{s[2]}K{s[3]}V{s[4]}W{s[5]}{'tail' if s[6] else ''}"
                                               for s in SHAPES])
def test_triton_matches_reference_fp32(device, shape):
    B, T, H, K, V, W, tail = shape
    x, weights, tail_BCW = inputs(*shape, torch.float32, device)
    got, want = run("triton", x, weights, tail_BCW, K), run("reference", x, weights, tail_BCW, K)
    for name, a, e in zip(["q", "k", "v", "dx", "dwq", "dwk", "dwv"], got, want):
        assert a.shape == e.shape and a.dtype == e.dtype, name
        assert a.is_contiguous(), name
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_backward_program_looping_over_several_time_tiles(device, monkeypatch):
    """Few weight-gradient partials (WEIGHT_PARTIALS): each backward program runs three 32-token tiles of 70."""
    from hymo_core.kernels import causal_conv1d

    monkeypatch.setattr(causal_conv1d, "WEIGHT_PARTIALS", 2)
    shape = (2, 70, 1, 32, 32, 4, True)
    assert causal_conv1d.backward_grid(2, 70, causal_conv1d.block_t(causal_conv1d.BACKWARD_TILE, 32)) == (3, 1)
    x, weights, tail_BCW = inputs(*shape, torch.float32, device)
    for name, a, e in zip(["q", "k", "v", "dx", "dwq", "dwk", "dwv"], run("triton", x, weights, tail_BCW, 32),
                          run("reference", x, weights, tail_BCW, 32)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_triton_fp16_within_half_precision_of_fp32_reference(device):
    B, T, H, K, V, W, tail = SHAPES[0]
    x, weights, _ = inputs(*SHAPES[0], torch.float16, device)
    got = run("triton", x, weights, None, K)
    want = run("reference", x.float(), [w.float() for w in weights], None, K)
    for name, a, e in zip(["q", "k", "v", "dx", "dwq", "dwk", "dwv"], got, want):
        assert a.dtype == torch.float16, name
        scale = e.abs().max().item()  # the weight gradients sum B x T products: compare relative to their size
        torch.testing.assert_close(a.float(), e, rtol=4e-3, atol=4e-3 * max(1.0, scale), msg=lambda m: f"{name}: {m}")


def test_tail_carried_across_calls_equals_one_call(device):
    """Decoding: a prefill, single tokens, then a chunk, each continuing the last W - 1 inputs, give one call's q, k, v."""
    B, T, H, K, V, W = 2, 11, 2, 8, 16, 4
    x, weights, _ = inputs(B, T, H, K, V, W, False, torch.float32, device)
    whole = causal_conv1d_qkv(x, *weights, K, backend="triton")
    tail = torch.zeros(B, x.shape[-1], W - 1, device=device)
    pieces = []
    for start, stop in ((0, 2), (2, 3), (3, 4), (4, T)):
        pieces.append(causal_conv1d_qkv(x[:, start:stop], *weights, K, tail, backend="triton"))
        tail = torch.cat((tail, x[:, start:stop].transpose(1, 2)), dim=2)[:, :, -(W - 1):]
    for i, name in enumerate("qkv"):
        torch.testing.assert_close(torch.cat([p[i] for p in pieces], dim=1), whole[i], rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")


def test_q_and_k_heads_are_unit_norm_and_v_is_silu_of_the_conv(device):
    """What the reference stands for, checked directly: q, k rows of unit length per head; v = silu(causal conv)."""
    B, T, H, K, V, W, _ = SHAPES[0]
    x, weights, _ = inputs(*SHAPES[0], torch.float32, device)
    q, k, v = causal_conv1d_qkv(x, *weights, K, backend="triton")
    for t in (q, k):
        torch.testing.assert_close(t.reshape(B, T, H, K).norm(dim=-1), torch.ones(B, T, H, device=device))
    xv = x[..., 2 * H * K:]
    padded = torch.cat((xv.new_zeros(B, W - 1, H * V), xv), dim=1)
    conv = sum(padded[:, j:j + T] * weights[2][:, 0, j] for j in range(W))
    torch.testing.assert_close(v, torch.nn.functional.silu(conv), rtol=1e-5, atol=1e-6)


def test_reference_is_the_layers_former_conv1d_path():
    """The CPU body is F.conv1d on the transposed, zero-padded input, then SiLU, then F.normalize of q and k."""
    x, weights, tail = inputs(2, 9, 2, 8, 16, 4, True, torch.float32, "cpu")
    q, k, v = causal_conv1d_qkv_reference(x, *weights, tail, 8)
    y = torch.nn.functional.silu(torch.nn.functional.conv1d(torch.cat((tail, x.transpose(1, 2)), 2),
                                                            torch.cat(weights), groups=x.shape[-1])).transpose(1, 2)
    torch.testing.assert_close(v, y[..., 32:])
    torch.testing.assert_close(torch.cat((q, k), -1),
                               torch.nn.functional.normalize(y[..., :32].reshape(2, 9, 4, 8), dim=-1).reshape(2, 9, 32))


def test_disagreeing_shapes_are_refused():
    x, (wq, wk, wv), _ = inputs(1, 4, 2, 8, 16, 4, False, torch.float32, "cpu")
    with pytest.raises(ValueError, match="disagree"):
        causal_conv1d_qkv(x, wq, wk, wv, 12)  # 16 q channels are not whole heads of 12
    with pytest.raises(ValueError, match="disagree"):
        causal_conv1d_qkv(x[..., 1:], wq, wk, wv, 8)
    with pytest.raises(ValueError, match="tail"):
        causal_conv1d_qkv(x, wq, wk, wv, 8, torch.zeros(1, x.shape[-1], 4))

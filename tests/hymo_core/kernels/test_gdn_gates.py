"""GDN's gates (kernels/gdn_gates.py): the Triton kernels against the PyTorch reference, forward and backward.

a and b are views of a leaf projection, as GDN's fused input projection gives them, so the gradients
arrive through them: read in place through the row stride (the batch stride at T = 1), or copied where
batch and time do not merge. The pre-activations span softplus's threshold (20) and its far negative
tail, where log(1 + exp(x)) would round to 0; g keeps its relative precision there. 2 x 700 tokens make
each backward program loop over several token blocks (four programs on the CPU). Without a GPU the
kernels run under TRITON_INTERPRET=1 in a child pytest.
"""

import pytest
import torch

pytest.importorskip("triton")

from interpreter_child import RUN_HERE, run_module_in_interpreter  # noqa: E402

from hymo_core.kernels.gdn_gates import gdn_gates  # noqa: E402

NAMES = ["g", "beta", "dproj", "dA_log", "ddt_bias"]
# How a and b are cut from the projection: read through its row stride, or copied where rows do not merge.
VIEWS = {
    "in place": lambda proj, H: (proj[..., :H], proj[..., H:2 * H]),
    "last token": lambda proj, H: (proj[:, -1:, :H], proj[:, -1:, H:2 * H]),  # T = 1: the batch stride is the row's
    "first tokens": lambda proj, H: (proj[:, :-1, :H], proj[:, :-1, H:2 * H]),  # batch stride != T x row: a copy
}


@pytest.fixture(scope="module")
def device():
    if not RUN_HERE:
        pytest.skip("run by test_gdn_gates_under_triton_interpreter_in_a_child_process")
    return "cuda" if torch.cuda.is_available() else "cpu"


def inputs(B, T, H, dtype, device):
    """GDN's projection (x W_a and x W_b side by side, then other columns), A_log and dt_bias."""
    g = torch.Generator().manual_seed(0)
    proj = torch.randn(B, T, 2 * H + 5, generator=g) * 8
    proj[0, 0, :H] = torch.tensor([30.0, -40.0, 19.5, -19.0, 0.0][:H] + [1.0] * max(0, H - 5))
    A_log = torch.rand(H, generator=g).mul(16).clamp(min=1e-4).log()
    dt_bias = torch.randn(H, generator=g)
    return proj.to(device=device, dtype=dtype), A_log.to(device), dt_bias.to(device)


def run(backend, proj, A_log, dt_bias, view="in place"):
    """(g, beta) of a and b cut from a leaf projection by `view`, and the gradients of the projection and both
    parameters for a fixed random upstream."""
    leaves = [t.detach().clone().requires_grad_() for t in (proj, A_log, dt_bias)]
    a, b = VIEWS[view](leaves[0], A_log.shape[0])
    assert not a.is_contiguous() and not b.is_contiguous()
    g_BTH, beta_BTH = gdn_gates(a, b, *leaves[1:], backend=backend)
    gen = torch.Generator().manual_seed(1)
    torch.autograd.backward((g_BTH, beta_BTH), [torch.randn(t.shape, generator=gen).to(t) for t in (g_BTH, beta_BTH)])
    return [g_BTH, beta_BTH] + [t.grad for t in leaves]


def assert_agree(got, want, **tolerance):
    for name, x, y in zip(NAMES, got, want):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        torch.testing.assert_close(x, y, **tolerance, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("shape, view", [((2, 700, 3), "in place"), ((1, 37, 5), "in place"), ((3, 1, 7), "in place"),
                                         ((3, 5, 7), "last token"), ((2, 41, 3), "first tokens")])
def test_triton_matches_reference_fp32(device, shape, view):
    proj, A_log, dt_bias = inputs(*shape, torch.float32, device)
    assert_agree(run("triton", proj, A_log, dt_bias, view), run("reference", proj, A_log, dt_bias, view),
                 rtol=1e-5, atol=1e-5)


def test_g_keeps_its_relative_precision_where_softplus_is_tiny(device):
    """softplus(x) for x from -80 to 30 within 1e-5 relative, no absolute slack: log(1 + exp(x)) in fp32 is off by
    ~6e-8 exp(-x) relative (1 + e rounds; 1e-3 at x = -10) and is 0 below x ~ -17, the gates' log decay with it."""
    H = 4
    proj = torch.zeros(1, 1101, 2 * H, device=device)
    proj[0, :, :H] = torch.linspace(-80, 30, 1101, device=device)[:, None]
    A_log, dt_bias = torch.tensor([-2.0, 0.0, 1.0, 2.7], device=device), torch.tensor([0.0, 0.3, -0.7, 1e-3], device=device)
    got, want = (run(backend, proj, A_log, dt_bias)[0] for backend in ("triton", "reference"))
    assert (want < 0).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_half_inputs_match_reference(device, dtype):
    """bf16 projections (the trainer's, under autocast; fp16 too), fp32 parameters: fp32 gates, half gradients of
    the projection."""
    proj, A_log, dt_bias = inputs(2, 70, 3, dtype, device)
    got, want = run("triton", proj, A_log, dt_bias), run("reference", proj, A_log, dt_bias)
    assert [t.dtype for t in got] == [torch.float32] * 2 + [dtype] + [torch.float32] * 2
    for name, x, y in zip(NAMES, got, want):
        tolerance = dict(rtol=1e-5, atol=1e-5) if x.dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(x, y, **tolerance, msg=lambda m: f"{name}: {m}")


def test_shapes_that_disagree_are_refused():
    proj, A_log, dt_bias = inputs(1, 4, 3, torch.float32, "cpu")
    a, b = VIEWS["in place"](proj, 3)
    with pytest.raises(ValueError, match="disagree"):
        gdn_gates(a, b[..., :2], A_log, dt_bias)
    with pytest.raises(ValueError, match="disagree"):
        gdn_gates(a, b, A_log[:2], dt_bias)

"""MoE routing and dispatch ops (hymo_core/kernels/moe_dispatch.py): Triton equals the PyTorch reference, and the
layer built on them (tests/hymo_core/models/test_moe.py) equals the token-by-token oracle (issue 54).

Without a GPU the Triton kernels run in the interpreter, in a child pytest (interpreter_child.py); the CPU
reference tests run here.
"""

import pytest
import torch

from hymo_core.kernels.moe_dispatch import moe_combine, moe_permute, moe_permute_fanout, moe_plan, moe_route, plan_rows

pytest.importorskip("triton")

from interpreter_child import RUN_HERE, run_module_in_interpreter  # noqa: E402

BACKENDS = ["reference", "triton"] if RUN_HERE else ["reference"]


@pytest.mark.skipif(RUN_HERE, reason="kernels run in this process")
def test_moe_dispatch_under_triton_interpreter_in_a_child_process():
    run_module_in_interpreter(__file__)


@pytest.fixture(scope="module")
def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("backend", BACKENDS)
def test_plan_of_a_small_routing_by_hand(device, backend):
    """Stable ranks (token order inside an expert), groups padded to 4 rows, the capacity's drop, padding rows -1."""
    experts = torch.tensor([2, 0, 2, 1, 0, 2], device=device)
    rows = plan_rows(6, 3, 2, 4, 0)
    position, source, ends, counts = moe_plan(experts, 3, capacity=2, rows=rows, align=4, backend=backend)
    assert rows == 16
    assert position.tolist() == [8, 0, 9, 4, 1, -1]  # expert 2's third assignment is over its capacity of 2
    assert source.tolist() == [1, 4, -1, -1, 3, -1, -1, -1, 0, 2] + [-1] * 6
    assert ends.tolist() == [4, 8, 16] and ends.dtype == torch.int32  # the last group takes the slack
    assert counts.tolist() == [2, 1, 3]
    _, _, ends, _ = moe_plan(experts, 3, capacity=6, rows=18, group_rows=6, backend=backend)
    assert ends.tolist() == [6, 12, 18]  # the padded layout: a fixed group per expert


ROUTINGS = [  # (E, k, sigmoid, normalize, scale)
    (8, 2, True, True, 1.0), (16, 1, False, False, 1.0), (8, 3, False, False, 2.5), (6, 1, True, False, 1.0),
]


@pytest.mark.skipif(not RUN_HERE, reason="run by the child process")
@pytest.mark.parametrize("E,k,sigmoid,normalize,scale", ROUTINGS)
@pytest.mark.parametrize("logits_grad", [False, True], ids=["weights", "weights+logits"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_route_triton_equals_reference(device, E, k, sigmoid, normalize, scale, logits_grad, dtype):
    """The router's matmul (fp32 x and gate, the matmuls in `dtype`, as autocast runs them), top-k and weights, and
    x's, the gate's and (the aux loss's path) the logits' gradients. bf16: test_kernels_bf16_emulation.py (the
    interpreter's own bf16 dot multiplies bit patterns)."""
    N, D = 37, 80
    generator = torch.Generator().manual_seed(0)
    x, gate = torch.randn(N, D, generator=generator).to(device), (0.2 * torch.randn(E, D, generator=generator)).to(device)
    bias = (0.3 * torch.randn(E, generator=generator)).to(device)
    upstream = torch.randn(N, k, generator=generator).to(device)
    upstream_logits = torch.randn(N, E, generator=generator).to(device)
    results = {}
    for backend in ("triton", "reference"):
        xs, gs = x.clone().requires_grad_(), gate.clone().requires_grad_()
        weights, experts, logits = moe_route(xs, gs, bias, k, sigmoid, normalize, scale, dtype, backend=backend)
        assert logits.dtype == dtype and xs.dtype == torch.float32
        loss = (weights * upstream).sum() + ((logits * upstream_logits).sum() if logits_grad else 0.0)
        loss.backward()
        results[backend] = weights.detach(), experts, logits.detach(), xs.grad, gs.grad
    (w_t, e_t, *floats_t), (w_r, e_r, *floats_r) = results["triton"], results["reference"]
    assert torch.equal(e_t, e_r)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    for got, want in zip([w_t] + floats_t, [w_r] + floats_r):
        torch.testing.assert_close(got, want, **tolerance)
    assert floats_t[1].dtype == floats_t[2].dtype == torch.float32  # x and gate keep their own dtype


@pytest.mark.skipif(not RUN_HERE, reason="run by the child process")
@pytest.mark.parametrize("capacity,align,group_rows", [(40, 16, 0), (5, 16, 0), (40, 1, 0), (7, 1, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plan_permute_and_combine_triton_equal_reference(device, capacity, align, group_rows, dtype):
    """Every buffer layout (grouped, grouped with drops, looped / EP, padded), forward and backward: the plan with
    the balancing counters, the permute with two more readers of x (their gradients added in its backward)."""
    N, E, k, D = 40, 8, 2, 20
    generator = torch.Generator().manual_seed(2)
    experts = torch.stack([torch.randperm(E, generator=generator)[:k] for _ in range(N)]).to(device)
    experts[:12, 0] = 3  # a crowded expert, over a capacity of 5 or 7
    rows = plan_rows(N * k, E, capacity, align, group_rows)
    plans, counters = {}, {}
    for b in ("triton", "reference"):
        counters[b] = (torch.full((E,), 5.0, dtype=torch.float64, device=device), torch.ones((), dtype=torch.float64, device=device))
        plans[b] = moe_plan(experts, E, capacity, rows, align, group_rows, *counters[b], backend=b)
    for got, want in zip(plans["triton"] + counters["triton"], plans["reference"] + counters["reference"]):
        assert torch.equal(got, want)
    counts = torch.bincount(experts.reshape(-1), minlength=E).double()
    assert torch.equal(counters["triton"][0], 5.0 + counts)  # the balancing counters, added by the plan kernel
    assert float(counters["triton"][1]) == 1.0 + float((counts - capacity).clamp(min=0).sum())
    position, source, _, _ = plans["reference"]
    x = torch.randn(N, D, generator=generator).to(device)
    weights = torch.rand(N, k, generator=generator).to(device)
    base = torch.randn(N, D, generator=generator).to(device)
    upstream = torch.randn(N, D, generator=generator).to(device)
    results = {}
    for backend in ("triton", "reference"):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, weights, base))
        buffer, first, second = moe_permute_fanout(xs, source, position, k, dtype, readers=2, backend=backend)
        y = buffer * 1.5  # the experts, as far as dispatch is concerned
        out = moe_combine(y, source, position, ws, bs, torch.float32, backend=backend) + 2 * first - second
        assert torch.equal(moe_permute(xs, source, position, k, dtype, backend=backend), buffer)
        (out * upstream).sum().backward()
        results[backend] = [buffer.detach(), out.detach(), xs.grad, ws.grad, bs.grad]
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for got, want in zip(results["triton"], results["reference"]):
        torch.testing.assert_close(got, want, **tolerance)
    assert torch.equal(results["triton"][0][source < 0], torch.zeros_like(results["triton"][0][source < 0]))
    dropped = (position < 0).view(N, k)
    assert dropped.any() == (capacity < 12)
    assert torch.equal(results["triton"][3][dropped], torch.zeros_like(results["triton"][3][dropped]))

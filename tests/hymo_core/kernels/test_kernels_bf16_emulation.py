"""The bf16 path of every kernel that multiplies with tl.dot, run on the CPU with the GPU's bf16 arithmetic.

On bf16 inputs the GDN kernels, the logit probe and the MoE router's matmul feed tl.dot bf16 operands (casts the kernels make:
operands rounded to bf16, fp32 accumulation), keep intermediates in bf16 (w, u, the chunk states,
v_new, o), and take tf32 dots of the fp32 inverse. Triton's interpreter gets two of those wrong: its
bf16 dot multiplies the raw 16-bit patterns as integers, and its fp32 -> bf16 cast truncates. So the
other kernel tests never feed these kernels bf16. Here the interpreter's builder is patched, for this
module only, to do what an sm_80 / sm_90 GPU does:
- fp32 -> bf16 casts (stores, and dot operands) round to nearest even, bit-exactly (torch's cast; Triton
  lowers the cast to cvt.rn.bf16.f32);
- bf16 -> fp32 is exact (the 16 bits shifted up);
- a dot decodes bf16 / fp16 operands exactly and accumulates in fp32; an fp32 dot asked for tf32 drops
  its operands' low 13 mantissa bits first (what the tensor cores read), IEEE fp32 otherwise.
Then the real kernels run on real bf16 tensors, forward and backward, and are judged the way
bench/gpu_check.py judges them on the GPU: the largest max-relative error over outputs and input
gradients, against the PyTorch reference fed the fp32 inputs, must be within KERNEL_SLACK x the eager
bf16 reference's own error (the reference fed the bf16 inputs), or KERNEL_FLOOR.

What this cannot show is the accumulation order inside an MMA (fp32 either way), and compile-time
problems (tests/hymo_core/kernels/test_kernel_resources.py compiles every kernel for sm_80 / sm_90).
"""

import ast
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from interpreter_child import IN_INTERPRETER, REPO_ROOT, RUN_HERE, run_module_in_interpreter  # noqa: E402

from bench.gpu_check import KERNEL_FLOOR, KERNEL_SLACK  # noqa: E402
from bench.gpu_kernels import max_relative_error  # noqa: E402

KERNEL_DIR = REPO_ROOT / "hymo_core" / "kernels"
# The kernels each case launches; together they must be every kernel that uses tl.dot (checked below).
GDN_KERNELS = {"gate_inverse_kernel", "wu_kernel", "state_forward_kernel", "output_kernel", "dv_local_kernel",
               "state_backward_kernel", "dqkwg_kernel", "wy_backward_kernel"}
PROBE_KERNELS = {"_causal_max_logit_kernel"}
ROUTE_KERNELS = {"_route_forward_kernel", "_route_backward_kernel"}  # hymo::moe_route's x @ gate^T and dlogits @ gate


@pytest.mark.skipif(RUN_HERE, reason="kernels run in this process")
def test_bf16_emulation_under_triton_interpreter_in_a_child_process():
    print(run_module_in_interpreter(__file__))


def dot_kernels() -> set[str]:
    """Every @triton.jit function named *_kernel in hymo_core/kernels that reaches tl.dot, directly or
    through other jitted helpers (mm, mm32)."""
    calls, dots, kernels = {}, set(), set()
    for path in sorted(KERNEL_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef) or "jit" not in ast.unparse(node.decorator_list):
                continue
            called = set()
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    if ast.unparse(call.func) == "tl.dot":
                        dots.add(node.name)
                    elif isinstance(call.func, ast.Name):
                        called.add(call.func.id)
            calls[node.name] = called
            if node.name.endswith("_kernel"):
                kernels.add(node.name)
    changed = True
    while changed:
        grown = {name for name, called in calls.items() if called & dots} - dots
        dots |= grown
        changed = bool(grown)
    return kernels & dots


def test_the_cases_cover_every_tl_dot_kernel():
    found = dot_kernels()
    assert found >= {"dqkwg_kernel", "_causal_max_logit_kernel"}  # the scan does see through mm()
    covered = GDN_KERNELS | PROBE_KERNELS | ROUTE_KERNELS
    assert covered == found, f"kernels using tl.dot without a bf16 case here: {sorted(found - covered)}"


# ------------------------------------------------------------------ the GPU's bf16 arithmetic, in the interpreter

def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16, as the interpreter stores bf16), round to nearest even."""
    x = np.asarray(x, dtype=np.float32)
    flat = torch.from_numpy(x.reshape(-1).copy()).to(torch.bfloat16).view(torch.int16).numpy()
    return flat.view(np.uint16).reshape(x.shape)


def _bf16_value(bits: np.ndarray) -> np.ndarray:
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.fixture(scope="module")
def device():
    if not RUN_HERE:
        pytest.skip("run by test_bf16_emulation_under_triton_interpreter_in_a_child_process")
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def gpu_arithmetic(device, monkeypatch):
    """Patch the interpreter's casts and dots as the module docstring says; yields a Counter of
    (kernel, operand dtype) -> dots run, filled while a case runs."""
    if not IN_INTERPRETER:
        yield None  # a real GPU: nothing to emulate
        return
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    from hymo_core.kernels import gdn_triton, logit_probe, moe_dispatch, tuning

    builder = interpreter.InterpreterBuilder
    original_cast = builder.cast_impl
    dots, running = Counter(), [None]

    def cast_impl(self, src, dst_type):
        source, target = src.dtype.scalar, dst_type.scalar
        if source == tl.float32 and target == tl.bfloat16:
            return interpreter.TensorHandle(_bf16_bits(src.data), tl.bfloat16)
        if source == tl.bfloat16 and target == tl.float32:
            return interpreter.TensorHandle(_bf16_value(src.data), tl.float32)
        return original_cast(self, src, dst_type)

    def create_dot(self, a, b, acc, input_precision, max_num_imprecise_acc):
        def operand(x):
            if x.dtype.scalar == tl.bfloat16:
                return _bf16_value(x.data)
            value = x.data.astype(np.float32)
            if x.dtype.scalar == tl.float32 and input_precision == ir.INPUT_PRECISION.TF32:
                value = (value.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
            return value

        dots[(running[0], str(a.dtype.scalar))] += 1
        return interpreter.TensorHandle(np.matmul(operand(a), operand(b), dtype=np.float32) + acc.data,
                                        acc.dtype.scalar)

    def recording_launch(kernel, grid, *args, **constexprs):
        running[0] = kernel.__name__
        tuning.launch(kernel, grid, *args, **constexprs)

    class Recorded:
        """A kernel launched as kernel[grid](...) (moe_dispatch's), named while it runs."""

        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def run(*args, **constexprs):
                running[0] = self.name
                return self.kernel[grid](*args, **constexprs)
            return run

    for name in ROUTE_KERNELS:
        monkeypatch.setattr(moe_dispatch, name, Recorded(name, getattr(moe_dispatch, name)))
    monkeypatch.setattr(builder, "cast_impl", cast_impl)
    monkeypatch.setattr(builder, "create_dot", create_dot)
    monkeypatch.setattr(gdn_triton, "launch", recording_launch)
    monkeypatch.setattr(logit_probe, "launch", recording_launch)
    yield dots


def test_the_emulated_cast_rounds_to_nearest_even():
    """The patched cast against torch's, on ties both ways and on a value the interpreter truncates."""
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 2**-7 - 2**-20)], dtype=np.float32)
    expected = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(_bf16_value(_bf16_bits(x)), expected)
    assert expected.tolist() == [1.0, 1 + 2**-6, 1 + 2**-7, -(1 + 2**-7)]


# ------------------------------------------------------------------ the cases, judged as gpu_check judges them

def forward_backward(fn, inputs, upstream):
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    differentiable = [(o, u) for o, u in zip(outs, upstream) if o.requires_grad]
    if differentiable:
        torch.autograd.backward([o for o, _ in differentiable], [u.to(o.dtype) for o, u in differentiable])
    return [o.detach() for o in outs] + [x.grad for x in leaves if x.grad is not None]


def judged_errors(fn, inputs):
    """(triton error, eager bf16 error): max-relative errors over outputs and gradients against the reference
    fed the fp32 inputs, of each backend fed the inputs rounded to bf16."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        shapes = fn(*inputs, backend="reference")
    shapes = shapes if isinstance(shapes, tuple) else (shapes,)
    upstream = [torch.randn(o.shape, generator=generator).to(o.device) for o in shapes]
    truth = forward_backward(lambda *xs: fn(*xs, backend="reference"), inputs, upstream)
    bf16 = [x.to(torch.bfloat16) for x in inputs]
    errors = {}
    for backend in ("triton", "reference"):
        got = forward_backward(lambda *xs, b=backend: fn(*xs, backend=b), bf16, upstream)
        assert len(got) == len(truth), backend
        errors[backend] = [max_relative_error(g, t) for g, t in zip(got, truth)]
    print("per output, then per input gradient (triton / eager bf16):",
          ", ".join(f"{a:.1e}/{b:.1e}" for a, b in zip(errors["triton"], errors["reference"])))
    return max(errors["triton"]), max(errors["reference"])


def assert_within_gpu_check_bound(name, triton_error, eager_error):
    bound = max(KERNEL_SLACK * eager_error, KERNEL_FLOOR)
    print(f"{name}: triton {triton_error:.2e}, eager bf16 {eager_error:.2e}, bound {bound:.2e}")
    assert np.isfinite(triton_error) and triton_error <= bound, (
        f"{name}: bf16 Triton error {triton_error:.2e} > {bound:.2e} "
        f"(max of {KERNEL_SLACK} x eager bf16 error {eager_error:.2e} and {KERNEL_FLOOR})")


def assert_ran_bf16_dots(dots, kernels):
    if dots is None:
        return
    ran = {kernel for (kernel, dtype), count in dots.items() if dtype == "bf16" and count}
    assert kernels <= ran, f"kernels whose bf16 dots did not run: {sorted(kernels - ran)}"


def test_gdn_forward_and_backward_bf16(device, gpu_arithmetic):
    """T = 100 (a ragged chunk), K = 128 (hymo-750m's key head: two key blocks in the inverse and output
    passes, several in dq/dk), V = 48 (a ragged value block), an initial state and a loss on the final
    state, so every GDN kernel runs under both its flags; decays as in training (logsigmoid)."""
    from hymo_core.kernels.gdn import gated_delta_rule

    generator = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 100, 2, 128, 48
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=generator), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=generator), dim=-1)
    v = torch.randn(B, T, H, V, generator=generator)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=generator) + 2)
    beta = torch.rand(B, T, H, generator=generator)
    h0 = torch.randn(B, H, K, V, generator=generator)

    def gdn(q, k, v, g, beta, h0, backend):
        return gated_delta_rule(q, k, v, g.float(), beta.float(), initial_state_BHKV=h0.float(), backend=backend)

    triton_error, eager_error = judged_errors(gdn, [x.to(device) for x in (q, k, v, g, beta, h0)])
    assert_within_gpu_check_bound("gdn_chunk", triton_error, eager_error)
    assert_ran_bf16_dots(gpu_arithmetic, GDN_KERNELS)


def test_logit_probe_bf16(device, gpu_arithmetic):
    """GQA (4 query heads on 2 key heads), T = 70 (a ragged block), head dim 24 (padded to 32)."""
    from hymo_core.kernels.logit_probe import causal_max_logits

    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 70, 24, generator=generator) * 2
    k = torch.randn(1, 2, 70, 24, generator=generator) * 2

    def probe(q, k, backend):
        return causal_max_logits(q, k, 24 ** 0.5, backend=backend)

    triton_error, eager_error = judged_errors(probe, [q.to(device), k.to(device)])
    assert_within_gpu_check_bound("logit_probe", triton_error, eager_error)
    assert_ran_bf16_dots(gpu_arithmetic, PROBE_KERNELS)


def test_moe_route_bf16(device, gpu_arithmetic):
    """hymo-750m's router: 16 experts, top-1 softmax (and a top-2 sigmoid), d_model 896 over 14 steps of the
    kernel's d-block; N = 70 (a ragged row block). The logits get their own upstream (the aux loss's path), so the
    backward kernel adds it. Each token's logits are a permutation of 16 values 0.33 apart (x solved for them), so
    no top-k choice is a near tie that bf16 rounding could flip (a flip is another expert, not a kernel error)."""
    from hymo_core.kernels.moe_dispatch import moe_route

    generator = torch.Generator().manual_seed(4)
    N, D, E = 70, 896, 16
    gate = torch.randn(E, D, generator=generator) / D ** 0.5
    logits = torch.linspace(-2.5, 2.5, E)[torch.stack([torch.randperm(E, generator=generator) for _ in range(N)])]
    x = logits @ torch.linalg.solve(gate @ gate.T, gate)
    bias = torch.linspace(-0.002, 0.002, E)
    for k, sigmoid in ((1, False), (2, True)):
        def route(x, gate, bias, backend):
            return moe_route(x, gate, bias, k, sigmoid, sigmoid and k > 1, 1.0, x.dtype, backend=backend)

        with torch.no_grad():  # the bf16 routing chooses what the fp32 one does (so the weights are comparable)
            chosen = [route(*(t.to(device, dtype) for t in (x, gate, bias)), backend="reference")[1]
                      for dtype in (torch.float32, torch.bfloat16)]
        assert torch.equal(*chosen)
        triton_error, eager_error = judged_errors(route, [t.to(device) for t in (x, gate, bias)])
        assert_within_gpu_check_bound(f"moe_route k={k}", triton_error, eager_error)
    assert_ran_bf16_dots(gpu_arithmetic, ROUTE_KERNELS)

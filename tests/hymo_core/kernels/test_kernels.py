"""Every Triton kernel against its PyTorch reference, forward and backward.

Without a GPU the kernels run in Triton's interpreter. Triton reads
TRITON_INTERPRET when it is imported and when each kernel is decorated, so
it cannot be switched on inside a process that may already hold compiled
kernels. On such a machine this module therefore re-runs itself in a child
pytest with TRITON_INTERPRET=1: the rest of the suite keeps its environment,
and the child's individual results are printed if anything fails.

Tolerances: fp32 within 1e-5 relative (Liger-Kernel's fp32 tests allow more);
fp16 within half-precision rounding of the fp32-computed reference.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from hymo_core import kernels  # noqa: E402
from hymo_core.kernels import cross_entropy, norm  # noqa: E402
from hymo_core.models.model import ModelConfig, Transformer  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[3]
IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
RUN_HERE = torch.cuda.is_available() or IN_INTERPRETER
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float16: dict(rtol=2e-3, atol=2e-3)}


@pytest.mark.skipif(RUN_HERE, reason="kernels run in this process")
def test_kernels_under_triton_interpreter_in_a_child_process():
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__).resolve())],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT,
    )
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-3000:]
    # Everything but this launcher (skipped in the child) must have run and passed.
    assert " passed" in summary and "failed" not in summary and "1 skipped" in summary, summary
    print(child.stdout)


@pytest.fixture(scope="module")
def device():
    if not RUN_HERE:
        pytest.skip("run by test_kernels_under_triton_interpreter_in_a_child_process")
    return "cuda" if torch.cuda.is_available() else "cpu"


def close(actual, expected, dtype):
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, **TOLERANCE[dtype])


def leaf(tensor):
    return tensor.detach().clone().requires_grad_(True)


def both_backends(fn, inputs, grad_out_like=0, seed=0):
    """Run fn(*inputs, backend=b) for both backends; return outputs and input grads."""
    results = {}
    for backend in ("triton", "reference"):
        xs = [leaf(x) if x.is_floating_point() else x for x in inputs]
        out = fn(*xs, backend=backend)
        outs = out if isinstance(out, tuple) else (out,)
        generator = torch.Generator().manual_seed(seed)
        upstream = [torch.randn(o.shape, generator=generator).to(o) for o in outs]
        torch.autograd.backward(outs, upstream)
        results[backend] = (outs, [x.grad for x in xs if x.is_floating_point()])
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 7, 96), (11, 130), (2, 5, 3, 24)])
def test_rms_norm(device, shape, dtype):
    torch.manual_seed(0)
    x = torch.randn(shape, device=device).to(dtype) * 2
    weight = (1 + 0.2 * torch.randn(shape[-1], device=device)).to(dtype)
    results = both_backends(lambda a, w, backend: kernels.rms_norm(a, w, 1e-5, backend=backend), [x, weight])
    (out_t,), grads_t = results["triton"]
    (out_r,), grads_r = results["reference"]
    close(out_t, out_r, dtype)
    for gt, gr in zip(grads_t, grads_r):
        close(gt, gr, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 5, 77), (1029,), (2, 3, 688)])
def test_swiglu(device, shape, dtype):
    torch.manual_seed(1)
    gate = (torch.randn(shape, device=device) * 3).to(dtype)
    up = torch.randn(shape, device=device).to(dtype)
    results = both_backends(kernels.swiglu, [gate, up])
    (out_t,), grads_t = results["triton"]
    (out_r,), grads_r = results["reference"]
    close(out_t, out_r, dtype)
    for gt, gr in zip(grads_t, grads_r):
        close(gt, gr, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(2, 9, 3, 24), (1, 13, 5, 20), (3, 4, 2, 64)])
def test_rope(device, shape, dtype):
    torch.manual_seed(2)
    B, T, H, D = shape
    cos, sin = kernels.rope_tables(T + 3, D, 10000.0, device=device)
    x = torch.randn(shape, device=device).to(dtype)
    results = both_backends(lambda a, backend: kernels.apply_rope(a, cos, sin, backend=backend), [x])
    (out_t,), (grad_t,) = results["triton"]
    (out_r,), (grad_r,) = results["reference"]
    close(out_t, out_r, dtype)
    close(grad_t, grad_r, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_swiglu_packed_reads_the_projection_in_place(device, dtype):
    """The FFN's (..., 2F) [gate | up] tensor: same values and gradients as the two-tensor op on its halves."""
    torch.manual_seed(4)
    gate_up = (torch.randn(2, 7, 2 * 41, device=device) * 3).to(dtype)  # F = 41: rows straddle programs
    results = both_backends(lambda x, backend: kernels.swiglu(x, backend=backend), [gate_up])
    (out_t,), (grad_t,) = results["triton"]
    (out_r,), (grad_r,) = results["reference"]
    gate, up = leaf(gate_up[..., :41]), leaf(gate_up[..., 41:])
    split = kernels.swiglu(gate, up, backend="reference")
    split.backward(torch.randn(split.shape, generator=torch.Generator().manual_seed(0)).to(split))
    close(out_t, out_r, dtype)
    close(out_r, split, dtype)
    close(grad_t, grad_r, dtype)
    close(grad_r, torch.cat((gate.grad, up.grad), -1), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_reads_qkv_through_its_strides_and_passes_values(device, dtype, monkeypatch):
    """Attention's call: the fused projection's (B, T, H + 2K, D) output, q and k rotated, v copied; a grid of
    few programs (PROGRAMS 4) so each program loops over several tiles, the last one ragged."""
    from hymo_core.kernels import rotary

    monkeypatch.setattr(rotary, "PROGRAMS", 4)
    torch.manual_seed(5)
    B, T, H, K, D = 2, 37, 2, 1, 16
    cos, sin = kernels.rope_tables(T, D, 10000.0, device=device)
    qkv_wide = torch.randn(B, T, H + 2 * K + 1, D, device=device).to(dtype)  # one head more: x is a strided view
    results = both_backends(
        lambda x, backend: kernels.apply_rope(x[:, :, : H + 2 * K], cos, sin, backend=backend, rotated_heads=H + K),
        [qkv_wide])
    (out_t,), (grad_t,) = results["triton"]
    (out_r,), (grad_r,) = results["reference"]
    close(out_t, out_r, dtype)
    close(grad_t, grad_r, dtype)
    torch.testing.assert_close(out_t[:, :, H + K:], qkv_wide[:, :, H + K: H + 2 * K], rtol=0, atol=0)
    close(out_r[:, :, : H + K], kernels.apply_rope(qkv_wide[:, :, : H + K], cos, sin, backend="reference"), dtype)
    assert rotary.rope_grid(B * T, H + 2 * K, D // 2)[1] > 1  # tiles per program: the loop ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows, vocab, block_v", [(13, 1000, 256), (7, 997, None), (5, 4100, 1024)])
def test_cross_entropy_rows(device, rows, vocab, block_v, dtype):
    """Multi-chunk (block_v < V, ragged last chunk) and single-chunk reads, ignored rows included."""
    torch.manual_seed(3)
    logits = (torch.randn(rows, vocab, device=device) * 4).to(dtype)
    targets = torch.randint(0, vocab, (rows,), device=device)
    targets[1] = -100

    def rows_fn(x, t, backend):
        return cross_entropy.cross_entropy_rows(x, t, ignore_index=-100, backend=backend,
                                                block_v=block_v if backend == "triton" else None)

    results = both_backends(rows_fn, [logits, targets])
    (ce_t, lse_t), (grad_t,) = results["triton"]
    (ce_r, lse_r), (grad_r,) = results["reference"]
    close(ce_t, ce_r, torch.float32)  # per-row results are fp32 whatever the input
    close(lse_t, lse_r, torch.float32)
    assert ce_t[1] == 0.0
    close(grad_t, grad_r, dtype)


@pytest.mark.parametrize("z_loss", [0.0, 1e-3])
def test_cross_entropy_loss_with_z_loss(device, z_loss):
    torch.manual_seed(4)
    logits = torch.randn(17, 333, device=device) * 5
    targets = torch.randint(0, 333, (17,), device=device)
    targets[[0, 9]] = -100
    results = {}
    for backend in ("triton", "reference"):
        x = leaf(logits)
        loss, ce = kernels.cross_entropy_loss(x, targets, z_loss=z_loss, backend=backend)
        loss.backward()
        results[backend] = (loss, ce, x.grad)
    for actual, expected in zip(results["triton"], results["reference"]):
        close(actual, expected, torch.float32)
    loss, ce, _ = results["triton"]
    assert (loss > ce) == (z_loss > 0)


def test_whole_model_matches_across_backends(device):
    config = ModelConfig(vocab_size=67, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=40,
                         max_seq_len=8, qk_norm=True, z_loss=1e-4)
    results = {}
    for backend in ("triton", "reference"):
        torch.manual_seed(5)
        model = Transformer(config, kernel_backend=backend).to(device)
        tokens = torch.randint(0, 67, (2, 9), device=device)
        logits, loss = model(tokens[:, :-1], tokens[:, 1:], return_logits=True)
        loss.backward()
        results[backend] = (logits, loss, model.last_ce, [p.grad for p in model.parameters()])
    (logits_t, loss_t, ce_t, grads_t), (logits_r, loss_r, ce_r, grads_r) = results["triton"], results["reference"]
    torch.testing.assert_close(logits_t, logits_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_t, loss_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ce_t, ce_r, rtol=1e-5, atol=1e-6)
    for gt, gr in zip(grads_t, grads_r):
        torch.testing.assert_close(gt, gr, rtol=1e-4, atol=1e-6)


def test_dispatch_rules(device, monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.delenv("HYMO_KERNELS", raising=False)
    assert kernels.resolve_backend(cpu) == "reference"  # auto on CPU
    assert kernels.resolve_backend(cpu, "reference") == "reference"
    monkeypatch.setenv("HYMO_KERNELS", "reference")
    assert kernels.resolve_backend(cpu) == "reference"
    monkeypatch.setenv("HYMO_KERNELS", "triton")
    if IN_INTERPRETER:
        assert kernels.resolve_backend(cpu) == "triton"
    assert kernels.resolve_backend(cpu, "reference") == "reference"  # the argument wins
    monkeypatch.setenv("HYMO_KERNELS", "cuda-graphs")
    with pytest.raises(ValueError):
        kernels.resolve_backend(cpu)
    monkeypatch.delenv("HYMO_KERNELS")
    if IN_INTERPRETER:
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            kernels.resolve_backend(cpu, "triton")


def test_interpreter_is_really_in_use(device):
    expected = "InterpretedFunction" if IN_INTERPRETER else "JITFunction"
    assert type(norm._rms_norm_forward_kernel).__name__ == expected


# ---------------------------------------------------------------- Gated DeltaNet (chunked kernel)


@pytest.mark.parametrize("B, T, H, K, V, with_state", [(1, 1, 2, 16, 16, True), (1, 70, 2, 16, 32, True),
                                                       (2, 64, 1, 16, 16, False), (1, 130, 1, 128, 96, True)])
def test_gated_delta_rule_triton_matches_recurrent_and_chunked(device, B, T, H, K, V, with_state):
    """Odd T (a ragged last chunk), T = 1, several heads, carried state; K = 128 (hymo-750m's key head)
    loops over two key blocks in the inverse, w/u and output kernels and over several blocks in dq/dk,
    and V = 96 leaves a ragged value block in every kernel that blocks the values."""
    from test_gdn import assert_agree, gdn_inputs, run

    inputs = [x.to(device) for x in gdn_inputs(B, T, H, K, V)]
    triton_out = run("triton", inputs, with_state)
    assert_agree(triton_out, run("recurrent", inputs, with_state), 1e-4)
    assert_agree(triton_out, run("reference", inputs, with_state), 1e-4)


def test_gated_delta_rule_triton_with_the_ampere_configs(device, monkeypatch):
    """The configs autotune keeps on sm_80 block the keys at 16 in dq/dk (four key blocks whose gate
    gradients are summed) and the values at 16 / 32 in the state passes: the same numbers come out."""
    from test_gdn import assert_agree, gdn_inputs, run

    from hymo_core.kernels import tuning

    if not IN_INTERPRETER:
        pytest.skip("on a GPU the device's own configs run")
    monkeypatch.setattr(tuning, "device_capability", lambda: 80)
    inputs = [x.to(device) for x in gdn_inputs(1, 70, 2, 64, 48)]
    assert_agree(run("triton", inputs), run("recurrent", inputs), 1e-4)


def test_gated_delta_rule_triton_fp16(device):
    from test_gdn import assert_agree, gdn_inputs, run

    inputs = [x.to(device) for x in gdn_inputs(1, 70, 2, 16, 16, dtype=torch.float16)]
    assert_agree(run("triton", inputs), run("recurrent", inputs), 2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_causal_max_logits_triton(device, dtype):
    """GQA (4 query heads on 2 key heads), T = 70 (a ragged query and key block), head dim 24 (padded to 32);
    one huge last key is visible only to the last query, so the causal mask is exercised."""
    from hymo_core.kernels.logit_probe import causal_max_logits

    generator = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 70, 24, generator=generator)
    k = torch.randn(2, 2, 70, 24, generator=generator)
    k[:, :, -1] *= 50
    q, k = q.to(device, dtype), k.to(device, dtype)
    got = causal_max_logits(q, k, 24 ** 0.5, backend="triton")
    want = causal_max_logits(q, k, 24 ** 0.5, backend="reference")
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_causal_max_logits_skips_blocks_a_norm_bound_clears(device):
    """QK-Clip's threshold as `skip_below` (issue 54): the head over it (head 1, scaled 30x) is exact; the others
    report a value between their exact maximum and the threshold (the Cauchy-Schwarz bound of a block that ran
    no key tile), so they are not clipped either way."""
    from hymo_core.kernels.logit_probe import causal_max_logits

    generator = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 70, 24, generator=generator)
    k = torch.randn(2, 2, 70, 24, generator=generator)
    q[:, 1] *= 30
    q, k, tau = q.to(device), k.to(device), 20.0
    exact = causal_max_logits(q, k, 24 ** 0.5, backend="reference")
    got = causal_max_logits(q, k, 24 ** 0.5, backend="triton", skip_below=tau)
    above = exact > tau
    assert above.tolist() == [False, True, False, False]
    torch.testing.assert_close(got[above], exact[above], **TOLERANCE[torch.float32])
    assert (got[~above] >= exact[~above] * (1 - 1e-5)).all() and (got[~above] <= tau).all()
    assert (got[~above] > exact[~above] * 1.01).all()  # the bound, not the exact maximum: no key tile ran


if kernels.HAVE_TRITON:
    import triton
    import triton.language as tl

    from hymo_core.kernels.backend import wide_offset

    @triton.jit
    def _offsets_kernel(out_ptr, last_row, row_stride):
        row = tl.program_id(0) + last_row
        tl.store(out_ptr, wide_offset(row, row_stride))  # what the RMSNorm / RoPE / SwiGLU kernels use
        tl.store(out_ptr + 1, (row * row_stride).to(tl.int64))  # the int32 arithmetic they used before


def test_row_offsets_past_2_31_elements_do_not_wrap(device):
    """The last row's offset of a 2.2e9-element (rows, 4096) tensor, built without allocating the tensor."""
    rows, width = 2**31 // 4096 + 1024, 4096
    out = torch.zeros(2, dtype=torch.int64, device=device)
    _offsets_kernel[(1,)](out, rows - 1, width)
    wide, narrow = out.tolist()
    assert wide == (rows - 1) * width > 2**31
    assert narrow != wide  # int32 wraps: the bug the helper removes


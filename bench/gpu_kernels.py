"""GPU check of the Triton kernels: bf16 accuracy and speed vs eager and torch.compile.

For each kernel (RMSNorm, SwiGLU, RoPE, cross-entropy + z-loss) at a
Llama-8B-like size: compares the Triton output and input gradients in bf16
against the PyTorch reference evaluated in fp32 (the "truth"), next to the
same error of the eager bf16 reference, so a kernel is judged by whether it
is at least as accurate as what it replaces; then times forward+backward of
Triton, eager reference and torch.compile(reference).

    python bench/gpu_kernels.py            # needs CUDA; on CPU it says so and exits 0
    python bench/gpu_kernels.py --small    # quicker shapes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def max_relative_error(actual: torch.Tensor, truth: torch.Tensor) -> float:
    """max |a - t| / max |t|: a norm-wise error that does not explode near zeros."""
    return ((actual.float() - truth.float()).abs().max() / truth.float().abs().max().clamp(min=1e-30)).item()


def forward_backward(fn, inputs, upstream):
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward([o for o in outs], [u.to(o.dtype) for o, u in zip(outs, upstream)])
    return outs, [x.grad for x in leaves if x.is_floating_point()]


def bf16_errors(inputs, fn, reference, catch: bool = False) -> tuple[dict, list, list]:
    """Max relative error of `fn` in bf16 against `reference` in fp32 (outputs and input gradients), for
    backend "triton" and "reference"; with `catch`, a backend that raises gets NaN and "<backend>_error"."""
    bf16 = [x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs]
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        shapes = reference(*inputs)
    shapes = shapes if isinstance(shapes, tuple) else (shapes,)
    upstream = [torch.randn(o.shape, device="cuda", generator=gen) for o in shapes]
    truth_outs, truth_grads = forward_backward(reference, inputs, upstream)
    errors: dict = {}
    for backend in ("triton", "reference"):
        try:
            outs, grads = forward_backward(lambda *xs, b=backend: fn(*xs, backend=b), bf16, upstream)
            errors[backend] = max(max_relative_error(a, t) for a, t in zip([*outs, *grads], [*truth_outs, *truth_grads]))
        except Exception as error:  # noqa: BLE001 - with `catch`, a kernel that cannot launch is a finding
            if not catch:
                raise
            errors[backend] = float("nan")
            errors[f"{backend}_error"] = f"{type(error).__name__}: {error}"[:300]
    return errors, bf16, upstream


def cases(small: bool):
    from hymo_core import kernels
    from hymo_core.kernels.cross_entropy import cross_entropy_rows_reference

    tokens = 2048 if small else 8192
    d, ffn, heads, head_dim, vocab = 4096, 14336, 32, 128, 128256
    if small:
        ffn, vocab = 4096, 32000
    cos, sin = kernels.rope_tables(tokens, head_dim, 500000.0, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", generator=gen) * scale

    targets = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    yield (
        "rms_norm", [randn(tokens, d, scale=2.0), 1 + 0.1 * randn(d)],
        lambda x, w, backend: kernels.rms_norm(x, w, 1e-5, backend=backend),
        lambda x, w: kernels.rms_norm(x, w, 1e-5, backend="reference"),
    )
    yield (
        "swiglu", [randn(tokens, ffn, scale=3.0), randn(tokens, ffn)],
        lambda g, u, backend: kernels.swiglu(g, u, backend=backend),
        lambda g, u: kernels.swiglu(g, u, backend="reference"),
    )
    yield (
        "rope", [randn(1, tokens, heads, head_dim)],
        lambda x, backend: kernels.apply_rope(x, cos, sin, backend=backend),
        lambda x: kernels.apply_rope(x, cos, sin, backend="reference"),
    )
    yield (
        "cross_entropy+z", [randn(tokens, vocab, scale=4.0), targets],
        lambda x, t, backend: kernels.cross_entropy_rows(x, t, backend=backend),
        lambda x, t: cross_entropy_rows_reference(x, t),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_kernels.py needs a CUDA GPU; none found, nothing to do.")
        return 0
    import triton.testing

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    header = (f"{'kernel':16s} {'triton err':>11s} {'eager err':>10s} {'triton ms':>10s} {'eager ms':>9s} "
              f"{'compile ms':>11s} {'vs eager':>9s} {'vs compile':>11s}")
    print(header)
    failures = 0
    for name, inputs, fn, reference in cases(args.small):
        errors, bf16, upstream = bf16_errors(inputs, fn, reference)
        # A kernel may not be less accurate than the eager bf16 code it replaces (small slack for rounding).
        ok = errors["triton"] <= max(2 * errors["reference"], 1e-2)
        failures += not ok
        compiled = torch.compile(reference)
        timings = {}
        for label, callable_ in (("triton", lambda *xs: fn(*xs, backend="triton")), ("eager", reference),
                                 ("compile", compiled)):
            try:
                timings[label] = triton.testing.do_bench(lambda: forward_backward(callable_, bf16, upstream))
            except Exception as error:  # noqa: BLE001 - report and carry on with the other kernels
                print(f"  {name} {label} failed: {type(error).__name__}: {error}")
                timings[label] = float("nan")
        print(f"{name:16s} {errors['triton']:11.2e} {errors['reference']:10.2e} {timings['triton']:10.3f} "
              f"{timings['eager']:9.3f} {timings['compile']:11.3f} {timings['eager'] / timings['triton']:8.2f}x "
              f"{timings['compile'] / timings['triton']:10.2f}x {'' if ok else '  <-- less accurate than eager'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

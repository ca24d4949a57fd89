"""Which implementation of a kernel runs: Triton or the PyTorch reference.

`auto` (the default) picks Triton for CUDA tensors when Triton is installed
and the reference otherwise. `HYMO_KERNELS=triton|reference|auto` overrides
the default for a whole process; a `backend=` argument overrides both for one
call. Forcing Triton on CPU is how the tests run the kernels: under
`TRITON_INTERPRET=1`, which Triton reads when a kernel is *decorated*, i.e.
when the kernel module is imported (or reloaded).
"""

from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "triton", "reference")
ENV_VAR = "HYMO_KERNELS"

try:  # Triton is optional: CPU-only installs run the references.
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    HAVE_TRITON = False

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def wide_offset(index, stride):
        """index * stride as int64: program ids are int32, and a tensor past 2**31 elements would wrap."""
        return index.to(tl.int64) * stride


def resolve_backend(tensor: torch.Tensor, backend: str | None = None) -> str:
    """Return "triton" or "reference" for an op on `tensor`."""
    choice = backend or os.environ.get(ENV_VAR, "auto")
    if choice not in BACKENDS:
        raise ValueError(f"kernel backend must be one of {BACKENDS}, got {choice!r}")
    if choice == "auto":
        return "triton" if tensor.is_cuda and HAVE_TRITON else "reference"
    if choice == "triton":
        if not HAVE_TRITON:
            raise RuntimeError("kernel backend 'triton' requested but triton is not installed")
        if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "Triton kernels on CPU need TRITON_INTERPRET=1, set before the kernel "
                "modules are imported"
            )
    return choice


def inductor_generates(backend: str | None = None) -> bool:
    """True while torch.compile traces and the backend is `auto`: the op is then traced as plain PyTorch.

    Measured on the dense block (bench/dense_step_counts.py, docs/benchmarks.md): Inductor cannot fuse
    into a custom op, nor into a `torch.library.triton_op`'s user kernel (it only schedules around it), so
    an opaque norm costs the residual add its own kernel and a round trip of the residual stream; traced
    as plain PyTorch the add, norm, SwiGLU and RoPE become fused Inductor kernels.
    """
    return torch.compiler.is_compiling() and (backend or os.environ.get(ENV_VAR, "auto")) == "auto"


def program_count(device: torch.device, rows: int) -> int:
    """Programs for kernels that reduce over rows (one partial sum per program)."""
    if device.type == "cuda":
        sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(rows, 4 * sm_count))
    return max(1, min(rows, 4))  # the interpreter runs programs one by one



def reference_vjp(fn, inputs: list, upstream: list) -> list[torch.Tensor]:
    """Gradients of fn(*inputs) (a tuple of tensors) for each floating-point input, given `upstream`.

    The CPU bodies of the custom ops use this for their backward: the reference is plain PyTorch,
    and a custom op cannot keep the forward's autograd graph, so it is recomputed. Inside an op
    body the autograd keys are excluded; torch.func.vjp brings its own autograd level, so it
    still differentiates there. `upstream` None means no gradient for that output (zeros).
    """
    differentiable = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()]

    def of_differentiable(*tensors):
        args = list(inputs)
        for i, tensor in zip(differentiable, tensors):
            args[i] = tensor
        return tuple(fn(*args))

    outputs, pullback = torch.func.vjp(of_differentiable, *(inputs[i] for i in differentiable))
    cotangents = tuple(torch.zeros_like(o) if g is None else g.to(o.dtype) for o, g in zip(outputs, upstream))
    return list(pullback(cotangents))

"""Rotary position embedding, half-split layout (GPT-NeoX / Llama style).

Each head vector is split into halves (x1, x2) and rotated pairwise by the
angle of its position: (x1 cos - x2 sin, x2 cos + x1 sin). The rotation is
orthogonal, so the backward is the same kernel with the sine negated; no
activations are saved, only the fp32 cos/sin tables the module already owns.
Registered as the torch.library op `hymo::rope`; its backward is the same op.
"""

from __future__ import annotations

import torch

from hymo_core.kernels.backend import HAVE_TRITON, resolve_backend

if HAVE_TRITON:
    from hymo_core.kernels.backend import wide_offset


def rope_tables(seq_len: int, head_dim: int, base: float, device=None, position_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (cos_TD2, sin_TD2) with angle (t / position_scale) * base^(-2i/head_dim); position_scale > 1 is
    position interpolation (Chen et al. 2023): a window position_scale times longer maps onto the trained angles."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    inv_freq_D2 = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles_TD2 = torch.outer(torch.arange(seq_len, dtype=torch.float64, device=device) / position_scale, inv_freq_D2)
    return angles_TD2.cos().float(), angles_TD2.sin().float()


def apply_rope_reference(x_BTHD: torch.Tensor, cos_TD2: torch.Tensor, sin_TD2: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch on a (batch, time, heads, head_dim) tensor, fp32 math."""
    half = x_BTHD.shape[-1] // 2
    x_BTHD32 = x_BTHD.float()
    x1, x2 = x_BTHD32[..., :half], x_BTHD32[..., half:]
    cos_1T1D2 = cos_TD2[: x_BTHD.shape[1], None, :]
    sin_1T1D2 = sin_TD2[: x_BTHD.shape[1], None, :]
    rotated = torch.cat((x1 * cos_1T1D2 - x2 * sin_1T1D2, x2 * cos_1T1D2 + x1 * sin_1T1D2), dim=-1)
    return rotated.to(x_BTHD.dtype)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_kernel(
        x_ptr, cos_ptr, sin_ptr, y_ptr, T, H, HALF, SIN_SIGN: tl.constexpr, BLOCK_HALF: tl.constexpr
    ):
        row = tl.program_id(0)  # one (b, t, h) head vector per program
        t = (row // H) % T
        cols = tl.arange(0, BLOCK_HALF)
        mask = cols < HALF
        base = wide_offset(row, 2 * HALF)
        x1 = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + base + HALF + cols, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + t * HALF + cols, mask=mask, other=0.0)
        s = tl.load(sin_ptr + t * HALF + cols, mask=mask, other=0.0) * SIN_SIGN
        tl.store(y_ptr + base + cols, (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_ptr + base + HALF + cols, (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=mask)


def _rope_launch(x_BTHD: torch.Tensor, cos_TD2: torch.Tensor, sin_TD2: torch.Tensor, sin_sign: float):
    B, T, H, D = x_BTHD.shape
    x_BTHD = x_BTHD.contiguous()
    y_BTHD = torch.empty_like(x_BTHD)
    half = D // 2
    _rope_kernel[(B * T * H,)](
        x_BTHD, cos_TD2[:T].contiguous(), sin_TD2[:T].contiguous(), y_BTHD, T, H, half,
        SIN_SIGN=sin_sign, BLOCK_HALF=triton.next_power_of_2(half),
    )
    return y_BTHD


@torch.library.custom_op("hymo::rope", mutates_args=())
def rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sin_sign: float, backend: str) -> torch.Tensor:
    """Rotate by +angle (sin_sign 1) or -angle (-1, the backward: the rotation is orthogonal)."""
    if backend == "triton":
        return _rope_launch(x, cos, sin, sin_sign)
    return apply_rope_reference(x, cos, sin * sin_sign)


@rope_op.register_fake
def _(x, cos, sin, sin_sign, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_rope(ctx, inputs, output):
    x, cos, sin, sin_sign, backend = inputs
    ctx.save_for_backward(cos, sin)
    ctx.sin_sign, ctx.backend = sin_sign, backend


def _rope_backward(ctx, dy):
    cos, sin = ctx.saved_tensors
    return rope_op(dy, cos, sin, -ctx.sin_sign, ctx.backend), None, None, None, None


rope_op.register_autograd(_rope_backward, setup_context=_setup_rope)


def apply_rope(
    x_BTHD: torch.Tensor, cos_TD2: torch.Tensor, sin_TD2: torch.Tensor, backend: str | None = None
) -> torch.Tensor:
    """Rotate queries or keys laid out (batch, time, heads, head_dim): the op `hymo::rope`."""
    if x_BTHD.ndim != 4 or x_BTHD.shape[-1] != 2 * cos_TD2.shape[-1]:
        raise ValueError(f"expected (B, T, H, {2 * cos_TD2.shape[-1]}), got {tuple(x_BTHD.shape)}")
    if x_BTHD.shape[1] > cos_TD2.shape[0]:
        raise ValueError(f"sequence length {x_BTHD.shape[1]} exceeds RoPE table {cos_TD2.shape[0]}")
    return rope_op(x_BTHD, cos_TD2, sin_TD2, 1.0, resolve_backend(x_BTHD, backend))

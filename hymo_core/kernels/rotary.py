"""Rotary position embedding, half-split layout (GPT-NeoX / Llama style).

Each head vector is split into halves (x1, x2) and rotated pairwise by the
angle of its position: (x1 cos - x2 sin, x2 cos + x1 sin). The rotation is
orthogonal, so the backward is the same kernel with the sine negated; no
activations are saved, only the fp32 cos/sin tables the module already owns.
Registered as the torch.library op `hymo::rope`; its backward is the same op.

The op reads its input through its strides (any (B, T, heads, D) view whose head
vectors are contiguous, e.g. the q/k/v heads of the fused qkv projection's
output) and may rotate only the first `rotated_heads` heads, copying the rest:
attention rotates q and k and passes v in one call on the whole qkv tensor, so
the projection's output is never copied to be rotated, and the backward writes
one gradient for all of it (no `slice_backward` zero-fill and add, issue 53).

One program rotates one head of a run of tokens, BLOCK_T x BLOCK_HALF tiles at a
time, and the grid is capped near PROGRAMS programs: at 4 x 4096 tokens a few
waves on an H100 at every preset's width (bench/kernel_resources.py), where one
program per (token, head) made ~200k 32-element programs (94 waves). Under torch.compile with the `auto` backend it traces
as plain PyTorch (backend.inductor_generates), which Inductor fuses with the
split before it and the transpose after it.
"""

from __future__ import annotations

import torch

from hymo_core.kernels.backend import HAVE_TRITON, inductor_generates, resolve_backend

TILE = 2048  # elements of one half a tile rotates: BLOCK_T tokens x BLOCK_HALF
MAX_BLOCK_T = 64  # more rows only widen the per-row index math (registers), not the loads
PROGRAMS = 4096  # ~3 waves on an H100 at 9 programs an SM; each program loops over its share of the tiles


def rope_tables(seq_len: int, head_dim: int, base: float, device=None, position_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (cos_TD2, sin_TD2) with angle (t / position_scale) * base^(-2i/head_dim); position_scale > 1 is
    position interpolation (Chen et al. 2023): a window position_scale times longer maps onto the trained angles."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    inv_freq_D2 = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles_TD2 = torch.outer(torch.arange(seq_len, dtype=torch.float64, device=device) / position_scale, inv_freq_D2)
    return angles_TD2.cos().float(), angles_TD2.sin().float()


def apply_rope_reference(x_BTHD: torch.Tensor, cos_TD2: torch.Tensor, sin_TD2: torch.Tensor,
                         rotated_heads: int | None = None) -> torch.Tensor:
    """Plain PyTorch on a (batch, time, heads, head_dim) tensor, fp32 math; heads from `rotated_heads` on pass through."""
    R = x_BTHD.shape[2] if rotated_heads is None else rotated_heads
    half = x_BTHD.shape[-1] // 2
    x_BTHD32 = x_BTHD[:, :, :R].float()
    x1, x2 = x_BTHD32[..., :half], x_BTHD32[..., half:]
    cos_1T1D2 = cos_TD2[: x_BTHD.shape[1], None, :]
    sin_1T1D2 = sin_TD2[: x_BTHD.shape[1], None, :]
    rotated = torch.cat((x1 * cos_1T1D2 - x2 * sin_1T1D2, x2 * cos_1T1D2 + x1 * sin_1T1D2), dim=-1).to(x_BTHD.dtype)
    if R == x_BTHD.shape[2]:
        return rotated
    return torch.cat((rotated, x_BTHD[:, :, R:]), dim=2)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_kernel(
        x_ptr, cos_ptr, sin_ptr, y_ptr, N, T, X, ROTATED, HALF, stride_b, stride_t, stride_h, TILES,
        SIN_SIGN: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ):
        """Program (i, h): head h of the TILES tiles of BLOCK_T tokens from tile i*TILES; x strided, y contiguous
        (N, X, 2*HALF)."""
        head = tl.program_id(1)
        cols = tl.arange(0, BLOCK_HALF)
        rotate = (head < ROTATED).to(tl.float32)  # the other heads are copied: cos 1, sin 0
        for tile in range(0, TILES):
            n = (tl.program_id(0).to(tl.int64) * TILES + tile) * BLOCK_T + tl.arange(0, BLOCK_T)  # token b * T + t
            mask = (n < N)[:, None] & (cols < HALF)[None, :]
            t = n % T
            src = ((n // T) * stride_b + t * stride_t + head * stride_h)[:, None] + cols[None, :]
            dst = ((n * X + head) * (2 * HALF))[:, None] + cols[None, :]
            x1 = tl.load(x_ptr + src, mask=mask, other=0.0).to(tl.float32)
            x2 = tl.load(x_ptr + src + HALF, mask=mask, other=0.0).to(tl.float32)
            table = t[:, None] * HALF + cols[None, :]
            c = tl.load(cos_ptr + table, mask=mask, other=1.0) * rotate + (1.0 - rotate)
            s = tl.load(sin_ptr + table, mask=mask, other=0.0) * (SIN_SIGN * rotate)
            tl.store(y_ptr + dst, (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=mask)
            tl.store(y_ptr + dst + HALF, (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=mask)


def rope_grid(tokens: int, heads: int, half: int) -> tuple[int, int, int]:
    """(BLOCK_T, tiles per program, token programs): a TILE-element tile per half, at most about
    PROGRAMS programs in all (each then loops over its tiles), so the grid stays a few waves at any width."""
    block_t = max(1, min(MAX_BLOCK_T, TILE // triton.next_power_of_2(half)))
    tiles = triton.cdiv(tokens, block_t)
    token_programs = max(1, min(tiles, PROGRAMS // heads))
    per_program = triton.cdiv(tiles, token_programs)
    return block_t, per_program, triton.cdiv(tiles, per_program)


def _rope_launch(x_BTHD: torch.Tensor, cos_TD2: torch.Tensor, sin_TD2: torch.Tensor, sin_sign: float,
                 rotated_heads: int):
    B, T, X, D = x_BTHD.shape
    if x_BTHD.stride(-1) != 1:
        x_BTHD = x_BTHD.contiguous()
    y_BTHD = x_BTHD.new_empty(B, T, X, D)
    half = D // 2
    block_t, tiles, token_programs = rope_grid(B * T, X, half)
    _rope_kernel[(token_programs, X)](
        x_BTHD, cos_TD2[:T].contiguous(), sin_TD2[:T].contiguous(), y_BTHD, B * T, T, X, rotated_heads, half,
        x_BTHD.stride(0), x_BTHD.stride(1), x_BTHD.stride(2), tiles,
        SIN_SIGN=sin_sign, BLOCK_T=block_t, BLOCK_HALF=triton.next_power_of_2(half),
    )
    return y_BTHD


@torch.library.custom_op("hymo::rope", mutates_args=())
def rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sin_sign: float, rotated_heads: int,
            backend: str) -> torch.Tensor:
    """Rotate heads 0 .. rotated_heads - 1 by +angle (sin_sign 1) or -angle (-1, the backward: the rotation is
    orthogonal); copy the others."""
    if backend == "triton":
        return _rope_launch(x, cos, sin, sin_sign, rotated_heads)
    return apply_rope_reference(x, cos, sin * sin_sign, rotated_heads).contiguous()


@rope_op.register_fake
def _(x, cos, sin, sin_sign, rotated_heads, backend):
    return x.new_empty(x.shape)


def _setup_rope(ctx, inputs, output):
    x, cos, sin, sin_sign, rotated_heads, backend = inputs
    ctx.save_for_backward(cos, sin)
    ctx.sin_sign, ctx.rotated_heads, ctx.backend = sin_sign, rotated_heads, backend


def _rope_backward(ctx, dy):
    cos, sin = ctx.saved_tensors
    return rope_op(dy, cos, sin, -ctx.sin_sign, ctx.rotated_heads, ctx.backend), None, None, None, None, None


rope_op.register_autograd(_rope_backward, setup_context=_setup_rope)


def apply_rope(
    x_BTHD: torch.Tensor, cos_TD2: torch.Tensor, sin_TD2: torch.Tensor, backend: str | None = None,
    rotated_heads: int | None = None,
) -> torch.Tensor:
    """Rotate queries or keys laid out (batch, time, heads, head_dim): the op `hymo::rope`.

    `rotated_heads` R rotates heads 0 .. R - 1 and copies the rest (q and k rotated, v passed, in one call).
    """
    if x_BTHD.ndim != 4 or x_BTHD.shape[-1] != 2 * cos_TD2.shape[-1]:
        raise ValueError(f"expected (B, T, H, {2 * cos_TD2.shape[-1]}), got {tuple(x_BTHD.shape)}")
    if x_BTHD.shape[1] > cos_TD2.shape[0]:
        raise ValueError(f"sequence length {x_BTHD.shape[1]} exceeds RoPE table {cos_TD2.shape[0]}")
    rotated_heads = x_BTHD.shape[2] if rotated_heads is None else rotated_heads
    if not 0 <= rotated_heads <= x_BTHD.shape[2]:
        raise ValueError(f"rotated_heads {rotated_heads} outside 0 .. {x_BTHD.shape[2]}")
    if inductor_generates(backend):
        return apply_rope_reference(x_BTHD, cos_TD2, sin_TD2, rotated_heads)
    return rope_op(x_BTHD, cos_TD2, sin_TD2, 1.0, rotated_heads, resolve_backend(x_BTHD, backend))

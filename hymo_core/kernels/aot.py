"""Compile every Triton kernel ahead of time for a GPU target and read what one block of it costs.

No GPU is needed: `triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))` runs the
whole pipeline down to a cubin with the ptxas Triton ships, and the cuobjdump it ships reports
registers and stack frame (where ptxas puts spilled registers) per thread; Triton's metadata
gives the dynamic shared memory. Each launch is compiled as the JIT would specialise it:
pointers 16-byte aligned, integers that are multiples of 16 marked so (that is what lets loads
vectorise), constexprs and num_warps / num_stages as the launcher or an autotune config sets them.

`model_launches(shapes, capability)` lists the launches of every kernel at one model's widths
(`ModelKernelShapes`; hymo_core/models/kernel_shapes.py fills them for every preset) and every
config autotune may pick there; `usage()` compiles one (cached on disk by Triton and in memory
here) and returns its resources, occupancy and waves. tests/hymo_core/kernels/test_kernel_resources.py
asserts the limits; bench/kernel_resources.py writes the table in docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from hymo_core.kernels.rotary import rope_grid
from hymo_core.kernels.tuning import configs_for

# The runtime shape the grids (and so the waves) are counted at: hymo-750m's batch x heads.
WAVE_BATCH, WAVE_T = 4, 4096


@dataclass(frozen=True)
class Target:
    name: str
    device: str
    capability: int
    sms: int
    smem_per_block: int  # the most one block may ask for (opt-in maximum)
    smem_per_sm: int


TARGETS = {
    "sm_90": Target("sm_90", "H100 SXM", 90, 132, 227 * 1024, 228 * 1024),
    "sm_80": Target("sm_80", "A100", 80, 108, 163 * 1024, 164 * 1024),
}
MAX_REGISTERS = 255
REGISTERS_PER_SM, THREADS_PER_SM, BLOCKS_PER_SM = 65536, 2048, 32


@dataclass(frozen=True)
class Launch:
    """One compile: a kernel at one shape and one config, plus its grid at the wave shape."""

    kernel: str  # "module.function"
    preset: str
    shape: str
    args: tuple  # (name, value): ints, floats, or a pointer type such as "*bf16"
    constexprs: tuple  # (name, value)
    num_warps: int
    num_stages: int
    programs: int
    spill_budget: int  # bytes of stack per thread the kernel may spill

    @property
    def config(self) -> str:
        tuned = ", ".join(f"{k}={v}" for k, v in self.constexprs if k in ("BK", "BV", "BM", "BN"))
        return f"{tuned + ', ' if tuned else ''}w{self.num_warps} s{self.num_stages}"


@dataclass(frozen=True)
class Usage:
    launch: Launch
    target: Target
    shared: int  # bytes per block, dynamic + static
    registers: int
    spill: int  # stack frame bytes per thread
    programs_per_sm: int
    waves: int
    problems: tuple[str, ...] = field(default=())


def _jit_function(kernel: str):
    module, name = kernel.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    return getattr(fn, "jit_fn", fn)


def _specialisation(value) -> tuple[str, bool]:
    """(signature type, 16-divisible) as the JIT would specialise an argument value."""
    if isinstance(value, str):
        return value, True  # a pointer; torch allocations are 16-byte aligned
    if isinstance(value, float):
        return "fp32", False
    return ("i32" if abs(value) < 2**31 else "i64"), value % 16 == 0


def _compile(launch: Launch, capability: int):
    specialised = tuple((name, _specialisation(value)) for name, value in launch.args)
    return _compile_specialised(launch.kernel, specialised, launch.constexprs, launch.num_warps, launch.num_stages,
                                capability)


@functools.lru_cache(maxsize=None)
def _compile_specialised(kernel: str, args: tuple, constexprs: tuple, num_warps: int, num_stages: int,
                         capability: int):
    fn = _jit_function(kernel)
    kinds = dict(args)
    consts = dict(constexprs)
    signature, attrs = {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in consts:
            signature[name] = "constexpr"
            continue
        signature[name], divisible = kinds[name]
        if divisible:
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, consts, attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                              options=dict(num_warps=num_warps, num_stages=num_stages))
    # Triton 3.6 (the lent H200's) and 3.9 take the same ASTSource / GPUTarget arguments and both name the
    # dynamic shared memory `shared` (bench/kernel_resources.py --triton-env compiles under both).
    metadata = compiled.metadata
    shared = metadata["shared"] if isinstance(metadata, dict) else metadata.shared
    return shared, _cubin_resources(compiled.asm["cubin"])


def _cubin_resources(cubin: bytes) -> dict[str, int]:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        report = subprocess.run([str(tool), "-res-usage", handle.name], capture_output=True, text=True, check=True).stdout
    line = next(text for text in report.splitlines() if "REG:" in text)
    return {key: int(value) for key, value in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}


def occupancy(registers: int, shared: int, num_warps: int, target: Target) -> int:
    """Blocks resident per SM: the tightest of registers (allocated per warp in 256s), shared memory, threads."""
    per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by_registers = (REGISTERS_PER_SM // per_warp) // num_warps
    by_shared = target.smem_per_sm // (shared + 1024) if shared else BLOCKS_PER_SM  # 1 KB reserved per block
    by_threads = THREADS_PER_SM // (32 * num_warps)
    return max(0, min(by_registers, by_shared, by_threads, BLOCKS_PER_SM))


def usage(launch: Launch, target: Target) -> Usage:
    dynamic, resources = _compile(launch, target.capability)
    shared = dynamic + resources.get("SHARED", 0)
    registers, spill = resources["REG"], resources.get("STACK", 0) + resources.get("LOCAL", 0)
    per_sm = occupancy(registers, shared, launch.num_warps, target)
    waves = math.ceil(launch.programs / (per_sm * target.sms)) if per_sm else 0
    problems = []
    if shared > target.smem_per_block:
        problems.append(f"shared memory {shared / 1024:.0f} KB > {target.smem_per_block // 1024} KB")
    if registers > MAX_REGISTERS:
        problems.append(f"{registers} registers > {MAX_REGISTERS}")
    if spill > launch.spill_budget:
        problems.append(f"spills {spill} B/thread > budget {launch.spill_budget} B")
    if per_sm == 0:
        problems.append("no block fits on an SM")
    return Usage(launch, target, shared, registers, spill, per_sm, waves, tuple(problems))


# ------------------------------------------------------------------ the launches of every kernel


ELEMENTWISE = 0  # elementwise and row kernels must not spill at all
GDN_SPILL_BUDGET = {  # bytes per thread; see docs/benchmarks.md (kernel resources) for why each is what it is
    "gate_inverse_kernel": 0, "wu_kernel": 0, "output_kernel": 0, "dv_local_kernel": 0,
    "state_forward_kernel": 0, "state_backward_kernel": 0, "dqkwg_kernel": 0, "wy_backward_kernel": 0,
}
DEFAULT_WARPS, DEFAULT_STAGES = 4, 3  # what the JIT uses when a launch names neither


def _launches(kernel: str, preset: str, shape: str, args: dict, constexprs: dict, programs, budget: int,
              capability: int, options: tuple[int, int] = (DEFAULT_WARPS, DEFAULT_STAGES)) -> list[Launch]:
    """One Launch per config autotune may pick (or the fixed options of an untuned kernel).

    `programs` is the grid size, or a function of a config's meta-parameters for tuned kernels.
    """
    fn = getattr(importlib.import_module(kernel.rsplit(".", 1)[0]), kernel.rsplit(".", 1)[1])
    if not hasattr(fn, "configs"):
        return [Launch(kernel, preset, shape, tuple(args.items()), tuple(constexprs.items()), *options,
                       programs, budget)]
    out = []
    for config in configs_for(fn, {**args, **constexprs, "capability": capability}):
        meta = {**constexprs, **config.kwargs}
        grid = programs(meta) if callable(programs) else programs
        out.append(Launch(kernel, preset, shape, tuple(args.items()), tuple(meta.items()), config.num_warps,
                          config.num_stages, grid, budget))
    return out


@dataclass(frozen=True)
class ModelKernelShapes:
    """The widths one model launches its kernels at."""

    preset: str
    norm_widths: tuple[int, ...]  # every RMSNorm's width
    rope_dim: int
    heads: int  # attention heads (RoPE, the probe)
    ffn_dim: int
    vocab_size: int
    probe_dims: tuple[int, ...]  # q.k widths of the attention kinds QK-Clip probes
    gdn: tuple[int, int, int] | None  # (key head dim, value head dim, heads) of its GDN layers
    moe: tuple[int, int, int, bool] | None = None  # (routed experts, active per token, d_model, sigmoid) of its MoE
    gdn_conv_size: int = 4  # taps of the GDN layers' short convolution


def row_kernel_launches(model: ModelKernelShapes, capability: int) -> list[Launch]:
    """RMSNorm, RoPE, SwiGLU, cross-entropy + z-loss and the logit probe at one model's widths."""
    preset, rows = model.preset, WAVE_BATCH * WAVE_T
    bf16, fp32 = "*bf16", "*fp32"
    out = []
    for D in model.norm_widths:
        block = triton.next_power_of_2(D)
        out += _launches("hymo_core.kernels.norm._rms_norm_forward_kernel", preset, f"D={D}",
                         dict(x_ptr=bf16, weight_ptr=fp32, y_ptr=bf16, rstd_ptr=fp32, row_stride=D, D=D, eps=1e-5),
                         dict(BLOCK_D=block), rows, ELEMENTWISE, capability)
        programs = 4 * TARGETS["sm_90"].sms
        out += _launches("hymo_core.kernels.norm._rms_norm_backward_kernel", preset, f"D={D}",
                         dict(dy_ptr=bf16, x_ptr=bf16, weight_ptr=fp32, rstd_ptr=fp32, dx_ptr=bf16,
                              dweight_partial_ptr=fp32, row_stride=D, N=rows, D=D,
                              rows_per_program=math.ceil(rows / programs)),
                         dict(BLOCK_D=block), programs, ELEMENTWISE, capability)
    heads = model.heads
    half = model.rope_dim // 2
    # attention's call: queries, keys and values of the fused projection (keys and values: one per query head
    # here, the most a preset has), q and k rotated; strides of the (B, T, 3 heads, D) projection output
    block_t, tiles, token_programs = rope_grid(rows, 3 * heads, half)
    out += _launches("hymo_core.kernels.rotary._rope_kernel", preset, f"rope dim {model.rope_dim}",
                     dict(x_ptr=bf16, cos_ptr=fp32, sin_ptr=fp32, y_ptr=bf16, N=rows, T=WAVE_T, X=3 * heads,
                          ROTATED=2 * heads, HALF=half, stride_b=WAVE_T * 3 * heads * 2 * half,
                          stride_t=3 * heads * 2 * half, stride_h=2 * half, TILES=tiles),
                     dict(SIN_SIGN=1.0, BLOCK_T=block_t, BLOCK_HALF=triton.next_power_of_2(half)),
                     token_programs * 3 * heads, ELEMENTWISE, capability)
    n = rows * model.ffn_dim
    out += _launches("hymo_core.kernels.activation._swiglu_forward_kernel", preset, "1024 elements/program",
                     dict(gate_ptr=bf16, up_ptr=bf16, h_ptr=bf16, n=n, F=model.ffn_dim, row_stride=2 * model.ffn_dim),
                     dict(BLOCK=1024), math.ceil(n / 1024),
                     ELEMENTWISE, capability)
    out += _launches("hymo_core.kernels.activation._swiglu_backward_kernel", preset, "1024 elements/program",
                     dict(dh_ptr=bf16, gate_ptr=bf16, up_ptr=bf16, dgate_ptr=bf16, dup_ptr=bf16, n=n, F=model.ffn_dim,
                          row_stride=2 * model.ffn_dim),
                     dict(BLOCK=1024), math.ceil(n / 1024), ELEMENTWISE, capability)
    V = model.vocab_size
    block_v = min(4096, triton.next_power_of_2(V))
    out += _launches("hymo_core.kernels.cross_entropy._cross_entropy_forward_kernel", preset, f"vocab {V}",
                     dict(logits_ptr=bf16, targets_ptr="*i64", ce_ptr=fp32, lse_ptr=fp32, row_stride=V, V=V,
                          ignore_index=-100), dict(BLOCK_V=block_v), rows, ELEMENTWISE, capability)
    out += _launches("hymo_core.kernels.cross_entropy._cross_entropy_backward_kernel", preset, f"vocab {V}",
                     dict(logits_ptr=bf16, targets_ptr="*i64", lse_ptr=fp32, dce_ptr=fp32, dlse_ptr=fp32,
                          dlogits_ptr=bf16, row_stride=V, V=V, ignore_index=-100), dict(BLOCK_V=block_v), rows,
                     ELEMENTWISE, capability)
    for D in model.probe_dims:
        out += _launches("hymo_core.kernels.logit_probe._causal_max_logit_kernel", preset, f"qk dim {D}",
                         dict(q_ptr=bf16, k_ptr=bf16, key_norm_ptr=fp32, out_ptr=fp32, skip_below=100.0, T=WAVE_T, H=heads, G=1, D=D, NQ=WAVE_T // 64,
                              sq_b=WAVE_T * heads * D, sq_h=D, sq_t=heads * D, sk_b=WAVE_T * heads * D, sk_h=D,
                              sk_t=heads * D),
                         dict(BD=max(16, triton.next_power_of_2(D))),
                         lambda meta: math.ceil(WAVE_T / meta["BM"]) * WAVE_BATCH * heads, ELEMENTWISE, capability)
    return out


def gdn_launches(preset: str, K: int, V: int, H: int, capability: int) -> list[Launch]:
    """The eight GDN kernels at key/value head dims K, V; grids at WAVE_BATCH x H heads, WAVE_T tokens.

    The constexpr flags take their heavier value (initial state on, final state stored, dht given).
    """
    from hymo_core.kernels.gdn_triton import CHUNK, block_sizes
    from hymo_core.kernels.tuning import size_buckets

    sizes = block_sizes(WAVE_T, H, K, V)
    KP, BK, BV = sizes["KP"], sizes["BK"], sizes["BV"]
    T, B, NT = WAVE_T, WAVE_BATCH, WAVE_T // CHUNK
    bf16, fp32 = "*bf16", "*fp32"
    shape = f"K={K} V={V}"
    chunks = NT * B * H
    BH_BUCKET, T_BUCKET = size_buckets(B * H, T)  # the autotune key's problem size; the bodies do not read it
    gdn = "hymo_core.kernels.gdn_triton_"
    out = []

    def add(kernel, args, constexprs, programs):
        name = kernel.rsplit(".", 1)[1]
        out.extend(_launches(gdn + kernel, preset, shape, args, dict(C=CHUNK, **constexprs), programs,
                             GDN_SPILL_BUDGET[name], capability))

    add("intra.gate_inverse_kernel", dict(k_ptr=bf16, g_ptr=fp32, beta_ptr=fp32, G_ptr=fp32, Tinv_ptr=fp32, T=T, H=H,
                                          K=K), dict(BK=BK), chunks)
    add("intra.wu_kernel", dict(k_ptr=bf16, v_ptr=bf16, beta_ptr=fp32, G_ptr=fp32, Tinv_ptr=fp32, w_ptr=bf16,
                                u_ptr=bf16, T=T, H=H, K=K, V=V), dict(BK=BK, BV=BV), chunks)
    add("state.state_forward_kernel", dict(k_ptr=bf16, w_ptr=bf16, u_ptr=bf16, G_ptr=fp32, h0_ptr=fp32, hs_ptr=bf16,
                                           vnew_ptr=bf16, ht_ptr=fp32, T=T, H=H, K=K, V=V, NT=NT,
                                           BH_BUCKET=BH_BUCKET, T_BUCKET=T_BUCKET),
        dict(KP=KP, HAS_H0=True, STORE_FINAL=True), lambda meta: math.ceil(V / meta["BV"]) * B * H)
    add("output.output_kernel", dict(q_ptr=bf16, k_ptr=bf16, G_ptr=fp32, hs_ptr=bf16, vnew_ptr=bf16, o_ptr=bf16,
                                     scale=K ** -0.5, T=T, H=H, K=K, V=V, NT=NT, BH_BUCKET=BH_BUCKET,
                                     T_BUCKET=T_BUCKET), dict(BK=BK),
        lambda meta: math.ceil(V / meta["BV"]) * chunks)
    add("output.dv_local_kernel", dict(q_ptr=bf16, k_ptr=bf16, G_ptr=fp32, do_ptr=bf16, dv_local_ptr=bf16,
                                       scale=K ** -0.5, T=T, H=H, K=K, V=V), dict(BK=BK, BV=BV), chunks)
    add("state.state_backward_kernel", dict(q_ptr=bf16, k_ptr=bf16, w_ptr=bf16, G_ptr=fp32, do_ptr=bf16,
                                            dv_local_ptr=bf16, dht_ptr=fp32, dhs_ptr=bf16, dvnew_ptr=bf16,
                                            dh0_ptr=fp32, scale=K ** -0.5, T=T, H=H, K=K, V=V, NT=NT,
                                            BH_BUCKET=BH_BUCKET, T_BUCKET=T_BUCKET),
        dict(KP=KP, HAS_DHT=True), lambda meta: math.ceil(V / meta["BV"]) * B * H)
    add("output.dqkwg_kernel", dict(q_ptr=bf16, k_ptr=bf16, G_ptr=fp32, hs_ptr=bf16, dhs_ptr=bf16, vnew_ptr=bf16,
                                    do_ptr=bf16, dvnew_ptr=bf16, dq_ptr=fp32, dk_part_ptr=fp32, dw_ptr=fp32,
                                    dG_part_ptr=fp32, scale=K ** -0.5, B=B, T=T, H=H, K=K, V=V, NT=NT,
                                    BH_BUCKET=BH_BUCKET, T_BUCKET=T_BUCKET),
        dict(KP=KP, BV=BV), lambda meta: math.ceil(K / meta["BK"]) * chunks)
    add("intra.wy_backward_kernel", dict(k_ptr=bf16, v_ptr=bf16, beta_ptr=fp32, G_ptr=fp32, Tinv_ptr=fp32,
                                         dw_ptr=fp32, du_ptr=bf16, dk_part_ptr=fp32, dG_part_ptr=fp32, dk_ptr=fp32,
                                         dv_ptr=bf16, dbeta_ptr=fp32, dg_ptr=fp32, B=B, T=T, H=H, K=K, V=V,
                                         NK=math.ceil(K / 16)), dict(BK=min(32, BK), BV=min(32, BV)), chunks)
    return out


def moe_launches(preset: str, E: int, k: int, D: int, sigmoid: bool, capability: int) -> list[Launch]:
    """The MoE routing and dispatch kernels (kernels/moe_dispatch.py) over WAVE_BATCH x WAVE_T tokens, dropless."""
    from hymo_core.kernels import moe_dispatch as m

    N, A = WAVE_BATCH * WAVE_T, WAVE_BATCH * WAVE_T * k
    P = m.plan_rows(A, E, N, 16, 0)
    bf16, fp32, i32, i64 = "*bf16", "*fp32", "*i32", "*i64"
    shape, module = f"E={E} k={k} D={D}", "hymo_core.kernels.moe_dispatch."
    route = dict(K=k, SIGMOID=sigmoid, NORMALIZE=sigmoid and k > 1, IEEE=False, **m._route_blocks(E, k))
    rows = dict(BLOCK_R=m.ROWS, BLOCK_D=m.BLOCK_D)
    out = []

    def add(kernel, args, constexprs, programs, options=(DEFAULT_WARPS, DEFAULT_STAGES)):
        out.extend(_launches(module + kernel, preset, shape, args, constexprs, programs, ELEMENTWISE, capability, options))

    for inputs in (bf16, fp32):  # bf16 weights and activations, and the trainer's autocast (fp32 x and gate)
        add("_route_forward_kernel", dict(x_ptr=inputs, gate_ptr=inputs, bias_ptr=fp32, weights_ptr=fp32,
                                          experts_ptr=i64, logits_ptr=bf16, N=N, E=E, D=D, scale=1.0), route,
            math.ceil(N / m.ROUTE_ROWS))
        add("_route_backward_kernel", dict(dweights_ptr=fp32, dextra_ptr=bf16, logits_ptr=bf16, experts_ptr=i64,
                                           gate_ptr=inputs, dlogits_ptr=bf16, dx_ptr=inputs, N=N, E=E, D=D, scale=1.0),
            dict(HAS_DWEIGHTS=True, HAS_EXTRA=True, **route), math.ceil(N / m.ROUTE_ROWS))
    add("_plan_kernel", dict(experts_ptr=i64, position_ptr=i32, source_ptr=i32, ends_ptr=i32, counts_ptr=i64,
                             counts_into_ptr="*fp64", dropped_into_ptr="*fp64", A=A, E=E, capacity=N, rows=P, align=16,
                             group_rows=0),
        dict(COUNT=True, DROPPED=False, BLOCK_A=m.plan_block(E), BLOCK_E=m._next_pow2(E)), 1, (8, DEFAULT_STAGES))
    add("_permute_kernel", dict(x_ptr=bf16, source_ptr=i32, buffer_ptr=bf16, P=P, D=D, K=k), rows, math.ceil(P / m.ROWS))
    add("_permute_backward_kernel", dict(dbuffer_ptr=bf16, position_ptr=i32, first_ptr=bf16, second_ptr=bf16,
                                         dx_ptr=bf16, N=N, D=D), dict(K=k, ADDENDS=1, **rows), math.ceil(N / m.ROWS))
    add("_combine_kernel", dict(y_ptr=bf16, position_ptr=i32, weights_ptr=fp32, base_ptr=bf16, out_ptr=bf16, N=N, D=D),
        dict(K=k, HAS_BASE=True, **rows), math.ceil(N / m.ROWS))
    add("_combine_backward_kernel", dict(dout_ptr=bf16, y_ptr=bf16, source_ptr=i32, position_ptr=i32, weights_ptr=fp32,
                                         dy_ptr=bf16, dweights_ptr=fp32, P=P, A=A, D=D, K=k,
                                         row_programs=math.ceil(P / m.ROWS)), rows,
        math.ceil(P / m.ROWS) + math.ceil(A / m.ROWS))
    return out


def gdn_input_launches(preset: str, K: int, V: int, H: int, W: int, capability: int) -> list[Launch]:
    """GDN's fused short convolution (kernels/causal_conv1d.py) and gates (kernels/gdn_gates.py), forward and
    backward, reading the projection's (B, T, 2HK + 2HV + 2H) output in place; fp32 master weights (autocast
    leaves the ops' parameters alone). The conv's forward also at T = 1 with a cache's tail (decoding)."""
    from hymo_core.kernels import gdn_gates
    from hymo_core.kernels.causal_conv1d import BACKWARD_TILE, FORWARD_TILE, backward_grid, block_t, channel_blocks

    HK, HV = H * K, H * V
    C, row = 2 * HK + HV, 2 * HK + 2 * HV + 2 * H
    block_c, blocks = channel_blocks(K, 2 * HK, HV)
    bf16, fp32 = "*bf16", "*fp32"
    shape = f"K={K} V={V} W={W}"
    module = "hymo_core.kernels.causal_conv1d."
    out = []
    for T, tail in ((WAVE_T, False), (1, True)):
        bt = block_t(FORWARD_TILE, block_c)
        out += _launches(module + "_causal_conv1d_forward_kernel", preset, shape + (" decode" if tail else ""),
                         dict(x_ptr=bf16, tail_ptr=bf16, wq_ptr=fp32, wk_ptr=fp32, wv_ptr=fp32, q_ptr=bf16, k_ptr=bf16,
                              v_ptr=bf16, T=T, HK=HK, HV=HV, stride_xb=T * row, stride_xt=row,
                              stride_tb=C * (W - 1) if tail else 0, stride_tc=W - 1 if tail else 0,
                              stride_tw=1 if tail else 0, eps=1e-12),
                         dict(W=W, K=K, BLOCK_T=bt, BLOCK_C=block_c, HAS_TAIL=tail),
                         math.ceil(T / bt) * WAVE_BATCH * blocks, ELEMENTWISE, capability)
    bt = block_t(BACKWARD_TILE, block_c)
    tiles, programs = backward_grid(WAVE_BATCH, WAVE_T, bt)
    out += _launches(module + "_causal_conv1d_backward_kernel", preset, shape,
                     dict(x_ptr=bf16, tail_ptr=bf16, wq_ptr=fp32, wk_ptr=fp32, wv_ptr=fp32, dq_ptr=bf16, dk_ptr=bf16,
                          dv_ptr=bf16, dx_ptr=bf16, dw_partial_ptr=fp32, T=WAVE_T, HK=HK, HV=HV, C=C, TILES=tiles,
                          stride_xb=WAVE_T * row, stride_xt=row, stride_tb=0, stride_tc=0, stride_tw=0, eps=1e-12),
                     dict(W=W, W_POW2=triton.next_power_of_2(W), K=K, BLOCK_T=bt, BLOCK_C=block_c, HAS_TAIL=False),
                     programs * WAVE_BATCH * blocks, ELEMENTWISE, capability)
    gates_module = "hymo_core.kernels.gdn_gates."
    tokens, block_h = WAVE_BATCH * WAVE_T, triton.next_power_of_2(H)
    gates = dict(a_ptr=bf16, b_ptr=bf16, A_log_ptr=fp32, dt_bias_ptr=fp32)
    blocks_n = math.ceil(tokens / gdn_gates.BLOCK_N)
    out += _launches(gates_module + "_gdn_gates_forward_kernel", preset, f"H={H}",
                     dict(**gates, g_ptr=fp32, beta_ptr=fp32, N=tokens, H=H, stride_a=row, stride_b=row),
                     dict(BLOCK_N=gdn_gates.BLOCK_N, BLOCK_H=block_h), blocks_n, ELEMENTWISE, capability)
    programs = min(blocks_n, 4 * TARGETS["sm_90"].sms)  # backend.program_count on an H100
    out += _launches(gates_module + "_gdn_gates_backward_kernel", preset, f"H={H}",
                     dict(**gates, dg_ptr=fp32, dbeta_ptr=fp32, da_ptr=bf16, db_ptr=bf16, dA_partial_ptr=fp32,
                          ddt_partial_ptr=fp32, N=tokens, H=H, stride_a=row, stride_b=row,
                          blocks_per_program=math.ceil(blocks_n / programs)),
                     dict(BLOCK_N=gdn_gates.BLOCK_N, BLOCK_H=block_h), programs, ELEMENTWISE, capability)
    return out


def model_launches(models: list[ModelKernelShapes], capability: int) -> list[Launch]:
    """Every kernel at every model's widths and every config autotune may pick there on `capability`."""
    out, seen = [], set()
    for model in models:
        launches = row_kernel_launches(model, capability)
        if model.gdn:
            launches += gdn_launches(model.preset, *model.gdn, capability)
            launches += gdn_input_launches(model.preset, *model.gdn, model.gdn_conv_size, capability)
        if model.moe:
            launches += moe_launches(model.preset, *model.moe, capability)
        for launch in launches:
            key = (launch.kernel, launch.args, launch.constexprs, launch.num_warps, launch.num_stages)
            if key not in seen:
                seen.add(key)
                out.append(launch)
    return out


def _usage_job(job: tuple[Launch, str]) -> Usage:
    launch, target = job
    return usage(launch, TARGETS[target])


def all_usages(models: list[ModelKernelShapes], targets: list[str], workers: int) -> list[Usage]:
    """usage() of every model's launches on every target; compiles run in `workers` processes (Triton's
    pipeline holds the GIL for most of a compile)."""
    jobs = [(launch, target) for target in targets for launch in model_launches(models, TARGETS[target].capability)]
    if workers <= 1:
        return [_usage_job(job) for job in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_usage_job, jobs, chunksize=1))

"""The kernels are torch.library custom ops: torch.compile traces a hybrid block around them whole.

Each op's fake (meta) implementation and autograd rule are checked with torch.library.opcheck
on its CPU (reference) body, and a hymo-tiny GDN block and MLA block compile with
fullgraph=True (a graph break would raise) on CPU, forward and backward, to the same numbers
as eager. aot_eager runs AOTAutograd over fake tensors (the part custom ops must satisfy)
without needing a C++ compiler for Inductor.
"""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from hymo_core import kernels
from hymo_core.kernels.causal_conv1d import causal_conv1d_qkv_op
from hymo_core.kernels.gdn import gated_delta_rule_op
from hymo_core.kernels.gdn_gates import gdn_gates_op  # noqa: F401 (registers hymo::gdn_gates)
from hymo_core.kernels.grouped_mm import grouped_mm_op  # noqa: F401 (registers hymo::grouped_mm)
from hymo_core.kernels.logit_probe import causal_max_logits_op
from hymo_core.kernels.moe_dispatch import plan_reference, plan_rows
from hymo_core.models.layers.block import Block
from hymo_core.models.layers.context import MixerContext
from hymo_core.models.presets import PRESETS


def op_cases():
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).requires_grad_()

    q, k = r(1, 9, 2, 8), F.normalize(torch.randn(1, 9, 2, 8, generator=g), dim=-1).requires_grad_()
    gdn = (q, k, r(1, 9, 2, 8), (-torch.rand(1, 9, 2, generator=g)).requires_grad_(),
           torch.rand(1, 9, 2, generator=g).requires_grad_(), r(1, 2, 8, 8), 8 ** -0.5, "reference")
    cos, sin = kernels.rope_tables(16, 8, 10000.0)
    # MoE dispatch (hymo_core/kernels/moe_dispatch.py): 9 tokens, 4 experts, top-2, the grouped layout (groups of 16
    # rows) with a capacity of 5 that drops; the plan adds to the balancing counters it is given.
    experts = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(9)])
    experts[:6, 0] = 1
    rows = plan_rows(18, 4, 5, 16, 0)
    position, source, _, _ = plan_reference(experts.reshape(-1), 4, 5, rows, 16, 0)
    return {
        "rms_norm": (torch.ops.hymo.rms_norm.default, (r(3, 5, 16), r(16), 1e-5, "reference")),
        "swiglu": (torch.ops.hymo.swiglu.default, (r(4, 12), r(4, 12), "reference")),
        "swiglu_packed": (torch.ops.hymo.swiglu_packed.default, (r(4, 24), "reference")),
        "rope": (torch.ops.hymo.rope.default, (r(2, 7, 3, 8), cos, sin, 1.0, 2, "reference")),
        "cross_entropy_rows": (torch.ops.hymo.cross_entropy_rows.default,
                               (r(6, 11), torch.tensor([0, 3, -100, 10, 2, 5]), -100, 16, "reference")),
        "gated_delta_rule": (gated_delta_rule_op._opoverload, gdn),
        "causal_conv1d_qkv": (causal_conv1d_qkv_op._opoverload, (r(2, 7, 40), r(8, 1, 4), r(8, 1, 4), r(24, 1, 4), None, 4,
                                                                 "reference")),
        "gdn_gates": (torch.ops.hymo.gdn_gates.default, (r(2, 9, 3), r(2, 9, 3), r(3), r(3), "reference")),
        # bf16 projections (autocast's) with fp32 parameters: the gates come out fp32, the fake must say so
        "gdn_gates_bf16": (torch.ops.hymo.gdn_gates.default,
                           (r(2, 9, 3).to(torch.bfloat16).detach().requires_grad_(),
                            r(2, 9, 3).to(torch.bfloat16).detach().requires_grad_(), r(3), r(3), "reference")),
        "causal_conv1d_qkv_tail": (causal_conv1d_qkv_op._opoverload,
                                   (r(2, 1, 40), r(8, 1, 4), r(8, 1, 4), r(24, 1, 4), torch.randn(2, 40, 3, generator=g), 4,
                                    "reference")),
        "grouped_mm": (torch.ops.hymo.grouped_mm.default, (r(32, 16), r(3, 16, 8), torch.tensor([16, 16, 32], dtype=torch.int32))),
        "causal_max_logits": (causal_max_logits_op._opoverload,
                              (torch.randn(1, 4, 9, 8, generator=g), torch.randn(1, 2, 9, 8, generator=g), 1 << 20,
                               "reference")),
        "moe_route": (torch.ops.hymo.moe_route.default,
                      (r(9, 16), r(4, 16), 0.1 * torch.randn(4, generator=g), 2, True, True, 1.5, torch.float32, "reference")),
        "moe_plan": (torch.ops.hymo.moe_plan.default,
                     (experts, 4, 5, rows, 16, 0, torch.zeros(4, dtype=torch.float64), torch.zeros((), dtype=torch.float64),
                      "reference")),
        "moe_permute": (torch.ops.hymo.moe_permute.default, (r(9, 16), source, position, 2, torch.float32, "reference")),
        "moe_combine": (torch.ops.hymo.moe_combine.default,
                        (r(rows, 16), source, position, r(9, 2), r(9, 16), torch.float32, "reference")),
    }


def strided(t):
    """The same values in a layout with the last dimension not contiguous, as a projection's view gives."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.dtype.is_floating_point:
        return t
    twisted = t.detach().transpose(-1, -2).contiguous().transpose(-1, -2)
    return twisted.requires_grad_(t.requires_grad)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("name", list(op_cases()))
def test_op_fake_and_autograd_registrations(name, layout):
    """Strided inputs: a fake that copies an input's strides while the real op returns a contiguous
    tensor made torch.compile's stride assert fail on the first GPU run (hymo-750m's GDN, compile on)."""
    op, args = op_cases()[name]
    if layout == "strided":
        args = tuple(strided(a) for a in args)
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_autograd_registration",
                                                "test_aot_dispatch_dynamic"))


def block_and_input(kind: str, moe: bool):
    config = replace(PRESETS["hymo-tiny"], moe_on=kind if moe else "")
    torch.manual_seed(0)
    block = Block(config, kind)
    cos, sin = kernels.rope_tables(config.max_seq_len, config.rope_dim, config.rope_base)
    x = torch.randn(2, 37, config.d_model)  # 37: a ragged GDN chunk
    return block, x, MixerContext(cos, sin)


def forward_backward(block, x, ctx):
    x = x.detach().clone().requires_grad_()
    y = block(x, ctx)
    (y.square().mean()).backward()
    return [y.detach(), x.grad] + [p.grad.clone() for p in block.parameters() if p.grad is not None]


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("kind", ["G", "M"])
def test_hymo_tiny_block_compiles_fullgraph_on_cpu(kind, moe):
    """G: short conv, L2 norms, the GDN op, gated RMSNorm, SwiGLU. M: MLA with RoPE and the RMSNorm ops. With MoE:
    the fused routing (the router's matmul inside it) and dispatch ops and the grouped expert matmuls in fp32 (the layout "auto" picks on the CPU)."""
    block, x, ctx = block_and_input(kind, moe=moe)
    if moe:
        block.ffn.experts.layout = "auto"
        assert block.ffn.experts.resolved_layout(x) == "grouped"
    eager = forward_backward(block, x, ctx)
    block.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got = forward_backward(compiled, x, ctx)
    assert len(got) == len(eager)
    for a, e in zip(got, eager):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)

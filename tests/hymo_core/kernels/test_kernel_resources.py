"""Every Triton kernel, compiled ahead of time for sm_90 (H100/H200) and sm_80 (A100), fits the chip.

No GPU is needed: Triton compiles to a cubin with the ptxas it ships and cuobjdump reads the
cubin's registers and stack (hymo_core/kernels/aot.py). Compiled: GDN forward and backward
(eight kernels), GDN's fused short convolution forward (training and decoding) and backward and its
gates forward and backward, RMSNorm forward and backward, RoPE, SwiGLU forward and backward, cross-entropy
+ z-loss forward and backward, the logit probe and the MoE routing / dispatch kernels, at the shapes of the dense
sample, hymo-tiny,
hymo-750m and Lab 4's head sizes, under every config autotune may pick at that shape. Each must
keep shared memory within the target's per-block limit (227 KB / 163 KB), registers <= 255, and
spill no more than its budget (aot.GDN_SPILL_BUDGET; 0 for the elementwise and row kernels).
A kernel that does not fit fails the test by name, shape, config and target.

Compiles run in a process pool and are cached for the session (and on disk by Triton).
"""

import dataclasses
import os

import pytest

pytest.importorskip("triton")

from hymo_core.kernels import aot  # noqa: E402
from hymo_core.kernels.tuning import INTERPRET, configs_for  # noqa: E402
from hymo_core.models.kernel_shapes import preset_kernel_shapes  # noqa: E402

pytestmark = pytest.mark.skipif(INTERPRET, reason="compiles real kernels; the interpreter replaces them")

KERNELS = {
    "gate_inverse_kernel", "wu_kernel", "state_forward_kernel", "output_kernel",  # GDN forward
    "dv_local_kernel", "state_backward_kernel", "dqkwg_kernel", "wy_backward_kernel",  # GDN backward
    "_rms_norm_forward_kernel", "_rms_norm_backward_kernel", "_rope_kernel", "_swiglu_forward_kernel",
    "_swiglu_backward_kernel", "_cross_entropy_forward_kernel", "_cross_entropy_backward_kernel",
    "_causal_max_logit_kernel",
    "_route_forward_kernel", "_route_backward_kernel", "_plan_kernel", "_permute_kernel",  # MoE dispatch
    "_permute_backward_kernel", "_combine_kernel", "_combine_backward_kernel",
    "_causal_conv1d_forward_kernel", "_causal_conv1d_backward_kernel", "_gdn_gates_forward_kernel",  # GDN's inputs
    "_gdn_gates_backward_kernel",
}


@pytest.fixture(scope="session")
def usages() -> list[aot.Usage]:
    workers = min(4, os.cpu_count() or 1)
    return aot.all_usages(preset_kernel_shapes(), list(aot.TARGETS), workers)


def describe(u: aot.Usage) -> str:
    return f"{u.launch.kernel} [{u.launch.preset}, {u.launch.shape}, {u.launch.config}] on {u.target.name}"


def test_every_kernel_fits_sm90_and_sm80(usages):
    misfits = [f"{describe(u)}: {'; '.join(u.problems)}" for u in usages if u.problems]
    assert not misfits, "kernels that do not fit:\n" + "\n".join(misfits)


def test_every_kernel_preset_and_target_was_compiled(usages):
    assert {u.launch.kernel.rsplit(".", 1)[1] for u in usages} == KERNELS
    assert {u.launch.preset for u in usages} == {"dense sample", "hymo-tiny", "hymo-750m", "lab-4"}
    assert {u.target.name for u in usages} == {"sm_80", "sm_90"}
    gdn = {(u.launch.preset, u.launch.kernel) for u in usages if ".gdn_triton_" in u.launch.kernel}
    assert {preset for preset, _ in gdn} == {"hymo-tiny", "hymo-750m", "lab-4"}
    assert all(u.registers > 0 for u in usages)  # a resource report was really read


def test_every_config_autotune_may_pick_is_compiled(usages):
    """hymo-750m: the GDN launches cover each tuned kernel's kept configs, no more, no fewer."""
    from hymo_core.kernels import gdn_triton_state

    for target in aot.TARGETS.values():
        kept = configs_for(gdn_triton_state.state_forward_kernel, {"KP": 128, "capability": target.capability})
        compiled = {u.launch.config for u in usages if u.target == target and u.launch.preset == "hymo-750m"
                    and u.launch.kernel.endswith("state_forward_kernel")}
        assert len(kept) >= 2 and compiled == {f"BV={c.kwargs['BV']}, w{c.num_warps} s{c.num_stages}" for c in kept}
        # BV 16 on two warps spills with a 128-wide key state: not a config autotune may pick there
        assert all(c.num_warps > 2 for c in kept)


def test_a_kernel_that_does_not_fit_is_named(usages):
    """On a made-up chip with 8 KB of shared memory per block, the GDN output kernel (41 KB or more at
    hymo-750m) does not fit, and the report says which launch and why (the same compile, cached)."""
    launch = next(u.launch for u in usages if u.launch.kernel.endswith("output_kernel")
                  and u.launch.preset == "hymo-750m" and u.target.name == "sm_90")
    small = dataclasses.replace(aot.TARGETS["sm_90"], name="sm_90 with 8 KB", smem_per_block=8 * 1024)
    result = aot.usage(launch, small)
    assert len(result.problems) == 1 and result.problems[0].startswith("shared memory")
    assert describe(result).startswith("hymo_core.kernels.gdn_triton_output.output_kernel [hymo-750m, K=128 V=256")


def test_occupancy_counts_the_tightest_resource():
    h100 = aot.TARGETS["sm_90"]
    assert aot.occupancy(32, 0, 4, h100) == 16  # threads: 2048 / 128
    assert aot.occupancy(255, 0, 4, h100) == 2  # registers: 65536 / (256 * 128)
    assert aot.occupancy(64, 100 * 1024, 4, h100) == 2  # shared memory: 228 KB / 101 KB


def test_rope_is_a_few_waves_at_every_preset(usages):
    """One program per (token, head) was 196,608 programs at the dense sample's 4 x 4096 tokens, 94 waves
    on an H100 (issue 53): now every preset's grid is at most 8 waves on 132 SMs."""
    rope = [u for u in usages if u.launch.kernel.endswith("_rope_kernel") and u.target.name == "sm_90"]
    assert {u.launch.preset for u in rope} == {"dense sample", "hymo-tiny", "hymo-750m", "lab-4"}
    assert all(0 < u.waves <= 8 for u in rope), [(u.launch.preset, u.launch.programs, u.waves) for u in rope]

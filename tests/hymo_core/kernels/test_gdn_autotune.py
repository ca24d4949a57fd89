"""The Gated DeltaNet kernels survive triton's autotuner: its first call, and its key.

On its first call for a key, triton's Autotuner runs every config kept for the shape on the caller's
own buffers (timing each), then runs the winner once more on the same buffers. A kernel that leaves
part of an output unwritten under some configs (dqkwg_kernel writes its gate gradient per key block,
and the number of key blocks is the config's) then hands stale numbers from a losing config to the
next pass. Here the interpreter replays that sequence, winner first or last, with the Hopper and the
Ampere configs, and every output and gradient must still equal the token-by-token oracle.

The autotuner caches its choice per key. A key of the head dims alone would let the first call, often
a small one (a smoke test, an evaluation batch), fix the configs of every later call; the key also
holds B x H and T, rounded up to powers of two. Checked by computing the keys triton would compute for
a small call and for hymo-750m's (4 x 4096 tokens, 7 heads), on the meta device.
"""

import pytest
import torch

pytest.importorskip("triton")

from interpreter_child import RUN_HERE, run_module_in_interpreter  # noqa: E402

from hymo_core.kernels import gdn_triton, tuning  # noqa: E402
from hymo_core.kernels.tuning import configs_for  # noqa: E402


@pytest.mark.skipif(RUN_HERE, reason="kernels run in this process")
def test_autotune_emulation_under_triton_interpreter_in_a_child_process():
    run_module_in_interpreter(__file__)


@pytest.fixture(scope="module")
def device():
    if not RUN_HERE:
        pytest.skip("run by test_autotune_emulation_under_triton_interpreter_in_a_child_process")
    return "cuda" if torch.cuda.is_available() else "cpu"


def replay_first_autotuned_call(winner: str):
    """tuning.launch as triton's Autotuner runs a kernel's first call for a key: every config kept for the
    shape in turn on the same buffers (after zeroing the kernel's `reset_to_zero` arguments, which is what
    its pre-hook does before each timed run), then the winning config once more."""
    def launch(kernel, grid, *args, **constexprs):
        named = dict(zip(kernel.arg_names, args))
        kept = configs_for(kernel, {**named, **constexprs, "capability": tuning.device_capability()})

        def run(config):
            meta = {**constexprs, **config.kwargs}
            kernel.jit_fn[grid(meta)](*args, **meta, num_warps=config.num_warps, num_stages=config.num_stages)

        for config in kept:
            for name in getattr(kernel, "reset_to_zero", ()):
                named[name].zero_()
            run(config)
        run(kept[0] if winner == "first" else kept[-1])

    return launch


@pytest.mark.parametrize("capability", [90, 80])
@pytest.mark.parametrize("winner", ["first", "last"])
def test_every_output_is_right_after_the_autotuners_first_call(device, monkeypatch, capability, winner):
    """K = 48: dqkwg's key block is 32 or 64 on Hopper, 16 or 32 on Ampere, so its configs compute the gate
    gradient in 1, 2 or 3 key blocks (the last one part-filled); T = 70 leaves a ragged chunk."""
    from test_gdn import assert_agree, gdn_inputs, run

    if not torch.cuda.is_available():
        monkeypatch.setattr(tuning, "device_capability", lambda: capability)
    elif capability != tuning.device_capability():
        pytest.skip("on a GPU the device's own configs run")
    monkeypatch.setattr(gdn_triton, "launch", replay_first_autotuned_call(winner))
    inputs = [x.to(device) for x in gdn_inputs(1, 70, 2, 48, 32)]
    assert_agree(run("triton", inputs), run("recurrent", inputs), 1e-4)


def autotune_keys(B, T, H, K, V, capability=90) -> dict[str, tuple]:
    """What triton's Autotuner would key each launch of a forward + backward on: the values of the kernel's
    `key` arguments, then the dtypes of its tensor arguments. Only kernels with more than one config kept
    (the ones it times); nothing runs (meta tensors)."""
    keys = {}

    def record(kernel, grid, *args, **constexprs):
        named = dict(zip(kernel.arg_names, args))
        if len(configs_for(kernel, {**named, **constexprs, "capability": capability})) > 1:
            keys[kernel.jit_fn.__name__] = (tuple(named[name] for name in kernel.key)
                                     + tuple(str(x.dtype) for x in args if isinstance(x, torch.Tensor)))

    meta = dict(device="meta", dtype=torch.bfloat16)
    q, k, do = torch.empty(B, T, H, K, **meta), torch.empty(B, T, H, K, **meta), torch.empty(B, T, H, V, **meta)
    v = torch.empty(B, T, H, V, **meta)
    g, beta = torch.empty(B, T, H, device="meta"), torch.empty(B, T, H, device="meta")
    original = gdn_triton.launch
    gdn_triton.launch = record
    try:
        o, ht, G, Tinv = gdn_triton.gdn_forward(q, k, v, g, beta, K ** -0.5, None)
        gdn_triton.gdn_backward(q, k, v, beta, G, Tinv, None, do, None, K ** -0.5)
    finally:
        gdn_triton.launch = original
    return keys


def test_the_autotune_key_holds_the_problem_size(device):
    small = autotune_keys(1, 64, 1, 128, 256)
    hymo_750m = autotune_keys(4, 4096, 7, 128, 256)
    assert {"output_kernel", "state_forward_kernel", "state_backward_kernel", "dqkwg_kernel"} <= set(hymo_750m)
    same = sorted(name for name in hymo_750m if small.get(name) == hymo_750m[name])
    assert not same, f"a small first call would fix these kernels' configs for hymo-750m: {same}"
    # Rounded, so a slightly shorter batch (a packed tail) or one head fewer reuses the choice, not re-times it.
    assert autotune_keys(4, 4000, 7, 128, 256) == hymo_750m == autotune_keys(4, 4096, 8, 128, 256)

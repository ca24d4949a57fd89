"""Autotuning that the interpreter and the offline resource check can both see through.

`autotuned(configs, key, keep)` wraps a jitted kernel in `triton.autotune` on a GPU; `keep(config,
meta)` drops the configs that cannot fit a given shape (say a value block too wide for a 256-wide
key state) before any is timed, and `only_on` marks configs for Hopper or Ampere. Under TRITON_INTERPRET=1 autotune would time each config with CUDA
events, so there the kernel stays a plain interpreted function and `launch` runs the first config
kept. Either way `.configs`, `.keep`, `.key`, `.reset_to_zero` and `.jit_fn` hang off the kernel:
they are what tests/hymo_core/kernels/test_kernel_resources.py compiles for sm_80 and sm_90, and what
tests/hymo_core/kernels/test_gdn_autotune.py replays the autotuner's first call with.

Two rules for a tuned kernel, because on its first call for a key the autotuner runs every config on
the caller's own buffers, then the winner once more:
- every config writes every element of every output: none accumulates into, or leaves unwritten, a
  part of a buffer that a losing config wrote (unless the buffer is named in `reset_to_zero`);
- a kernel whose best config depends on the problem size keys on it: `SIZE_KEY`, B x H and T rounded
  up to powers of two by `size_buckets`, passed as two arguments the body does not read. Keyed on
  the head dims alone, the first call (often a small one) would fix the configs of every later call.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import triton

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


HOPPER = 90  # capabilities from here up get the configs marked for Hopper, the rest those for Ampere


SIZE_KEY = ["BH_BUCKET", "T_BUCKET"]  # problem-size arguments of the tuned kernels, read only by the autotune key


def size_buckets(batch_heads: int, T: int) -> tuple[int, int]:
    """(B x H, T) rounded up to powers of two: the calls in one bucket share an autotune choice."""
    return triton.next_power_of_2(max(1, batch_heads)), triton.next_power_of_2(max(1, T))


def keep_all(config: triton.Config, meta: dict) -> bool:
    return True


def only_on(arch: str, config: triton.Config) -> triton.Config:
    """Mark a config for "hopper" (sm_90+: wgmma, operands in shared memory) or "ampere" (sm_80-89: mma.sync,
    operand fragments in registers, so the same tile needs more registers)."""
    config.arch = arch
    return config


def device_capability() -> int:
    """major * 10 + minor of the current CUDA device; the interpreter counts as Hopper."""
    import torch

    if INTERPRET or not torch.cuda.is_available():
        return HOPPER
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def configs_for(kernel, meta: dict) -> list[triton.Config]:
    """The configs autotune may pick for a launch whose arguments/constexprs are `meta` (with its "capability")."""
    arch = "hopper" if meta.get("capability", HOPPER) >= HOPPER else "ampere"
    return [config for config in kernel.configs
            if getattr(config, "arch", arch) == arch and kernel.keep(config, meta)]


def autotuned(configs: list[triton.Config], key: list[str], keep: Callable[[triton.Config, dict], bool] = keep_all,
              reset_to_zero: tuple[str, ...] = ()):
    def wrap(fn):
        if INTERPRET:
            kernel = fn
        else:
            def prune(candidates, named_args, **kwargs):
                return configs_for(kernel, {**named_args, **kwargs, "capability": device_capability()})

            kernel = triton.autotune(configs=configs, key=key, reset_to_zero=list(reset_to_zero) or None,
                                     prune_configs_by={"early_config_prune": prune})(fn)
        kernel.configs, kernel.keep, kernel.jit_fn, kernel.key = configs, keep, fn, list(key)
        if INTERPRET:  # triton's Autotuner holds the same list under the same name
            kernel.reset_to_zero = list(reset_to_zero)
        return kernel

    return wrap


def launch(kernel, grid: Callable[[dict], tuple], *args, **constexprs) -> None:
    """kernel[grid](*args, **constexprs); `grid` maps the chosen config's meta-parameters to a grid."""
    if isinstance(kernel, triton.runtime.Autotuner):
        kernel[grid](*args, **constexprs)
        return
    names = list(kernel.arg_names)
    meta = {**dict(zip(names, args)), **constexprs, "capability": device_capability()}
    config = configs_for(kernel, meta)[0]
    meta = {**constexprs, **config.kwargs}
    kernel[grid(meta)](*args, **meta, num_warps=config.num_warps, num_stages=config.num_stages)

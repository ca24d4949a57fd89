"""Autotuning that the interpreter and the offline resource check can both see through.

`autotuned(configs, key, keep)` wraps a jitted kernel in `triton.autotune` on a GPU; `keep(config,
meta)` drops the configs that cannot fit a given shape (say a value block too wide for a 256-wide
key state) before any is timed. Under TRITON_INTERPRET=1 autotune would time each config with CUDA
events, so there the kernel stays a plain interpreted function and `launch` runs the first config
kept. Either way `.configs`, `.keep` and `.jit_fn` hang off the kernel: they are what
tests/hymo_core/test_kernel_resources.py compiles for sm_80 and sm_90.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import triton

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def keep_all(config: triton.Config, meta: dict) -> bool:
    return True


def configs_for(kernel, meta: dict) -> list[triton.Config]:
    """The configs autotune may pick for a launch whose arguments/constexprs are `meta`."""
    return [config for config in kernel.configs if kernel.keep(config, meta)]


def autotuned(configs: list[triton.Config], key: list[str], keep: Callable[[triton.Config, dict], bool] = keep_all):
    def wrap(fn):
        if INTERPRET:
            kernel = fn
        else:
            def prune(candidates, named_args, **kwargs):
                return [c for c in candidates if keep(c, {**named_args, **kwargs})]

            kernel = triton.autotune(configs=configs, key=key, prune_configs_by={"early_config_prune": prune})(fn)
        kernel.configs, kernel.keep, kernel.jit_fn = configs, keep, fn
        return kernel

    return wrap


def launch(kernel, grid: Callable[[dict], tuple], *args, **constexprs) -> None:
    """kernel[grid](*args, **constexprs); `grid` maps the chosen config's meta-parameters to a grid."""
    if isinstance(kernel, triton.runtime.Autotuner):
        kernel[grid](*args, **constexprs)
        return
    names = list(kernel.arg_names)
    meta = {**dict(zip(names, args)), **constexprs}
    config = configs_for(kernel, meta)[0]
    meta = {**constexprs, **config.kwargs}
    kernel[grid(meta)](*args, **meta, num_warps=config.num_warps, num_stages=config.num_stages)

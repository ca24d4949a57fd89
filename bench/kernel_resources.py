"""Every Triton kernel compiled ahead of time for sm_90 and sm_80: shared memory, registers, spill, occupancy.

No GPU needed (hymo_core/kernels/aot.py). One row per kernel x preset shape x autotune config x
target, the same launches tests/hymo_core/kernels/test_kernel_resources.py checks. Programs per
SM is the tightest of registers, shared memory and threads; waves are the grid at batch 4 x
T 4096 x the preset's heads (hymo-750m's batch x heads for its rows) over 132 SMs (H100 SXM) or
108 (A100). Nothing here ran on a GPU.

    nice -n 10 python bench/kernel_resources.py     # prints, and updates docs/benchmarks.md
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.report import markdown_table, write_section  # noqa: E402
from hymo_core.kernels import aot  # noqa: E402
from hymo_core.models.kernel_shapes import preset_kernel_shapes  # noqa: E402

TITLE = "Triton kernels compiled for sm_90 and sm_80: resources per block (bench/kernel_resources.py)"


def main() -> int:
    import triton

    start = time.perf_counter()
    usages = aot.all_usages(preset_kernel_shapes(), list(aot.TARGETS), min(4, os.cpu_count() or 1))
    seconds = time.perf_counter() - start
    rows = [(u.launch.kernel.rsplit(".", 2)[-2] + "." + u.launch.kernel.rsplit(".", 1)[1], u.launch.preset,
             u.launch.shape, u.launch.config, u.target.name, f"{u.shared / 1024:.1f}", u.registers, u.spill,
             u.programs_per_sm, u.launch.programs, u.waves, "; ".join(u.problems) or "fits")
            for u in usages]
    header = ["kernel", "preset", "shape", "config", "target", "shared KB", "registers", "spill B/thread",
              "programs/SM", "programs", "waves", "verdict"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                            text=True).stdout.strip()
    load = os.getloadavg()[0]
    misfits = sum(1 for u in usages if u.problems)
    note = (f"Not measured on a GPU: compiled offline with Triton {triton.__version__} and its bundled ptxas, "
            f"read with its cuobjdump, at commit {commit}. Machine: {platform.machine()}, {os.cpu_count()} CPUs, "
            f"load average {load:.1f}; {len(usages)} launches read in {seconds:.0f} s (a warm Triton disk cache makes that fast; the compiles themselves take ~2 CPU-minutes). "
            f"Limits: shared memory 227 KB (sm_90) / 163 KB (sm_80) per block, 255 registers, spill budget 0 B "
            f"for every kernel (aot.GDN_SPILL_BUDGET, aot.ELEMENTWISE). Configs are those autotune may pick "
            f"at the shape on that target (Hopper and Ampere lists differ: mma.sync keeps operand fragments in "
            f"registers). GDN constexpr flags at their heavier value. Waves: grid / (programs per SM x SMs) at "
            f"batch 4, T 4096 and the preset's heads. {misfits} launch(es) do not fit.")
    table = markdown_table(header, rows)
    print(note)
    print(table)
    write_section(TITLE, table, note)
    return 1 if misfits else 0


if __name__ == "__main__":
    sys.exit(main())

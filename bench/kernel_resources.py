"""Every Triton kernel compiled ahead of time for sm_90 and sm_80: shared memory, registers, spill, occupancy.

No GPU needed (hymo_core/kernels/aot.py). One row per kernel x preset shape x autotune config x
target, the same launches tests/hymo_core/kernels/test_kernel_resources.py checks. Programs per
SM is the tightest of registers, shared memory and threads; waves are the grid at batch 4 x
T 4096 x the preset's heads (hymo-750m's batch x heads for its rows) over 132 SMs (H100 SXM) or
108 (A100). Nothing here ran on a GPU.

    nice -n 10 python bench/kernel_resources.py     # prints, and updates docs/benchmarks.md
    python bench/kernel_resources.py --json F --targets sm_90   # compile under this interpreter's triton, write F
    python bench/kernel_resources.py --triton-env /work/venvs/triton36/bin/python
        # sm_90 under this triton and under that interpreter's (a subprocess, PYTHONPATH=repo), side by side:
        # the device's triton (3.6) against the one the tests use; updates its own docs/benchmarks.md section
        # (that venv: python3 -m venv /work/venvs/triton36 && /work/venvs/triton36/bin/pip install torch==2.13.0 triton==3.6.0 numpy)

Compile counts are not timings: the tables may be written at any machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.report import markdown_table, write_section  # noqa: E402
from hymo_core.kernels import aot  # noqa: E402
from hymo_core.models.kernel_shapes import preset_kernel_shapes  # noqa: E402

TITLE = "Triton kernels compiled for sm_90 and sm_80: resources per block (bench/kernel_resources.py)"
VERSIONS_TITLE = "Triton kernels for sm_90 under the device's triton and ours (bench/kernel_resources.py --triton-env)"


def _kernel_name(kernel: str) -> str:
    return kernel.rsplit(".", 2)[-2] + "." + kernel.rsplit(".", 1)[1]


def _workers() -> int:
    return min(4, os.cpu_count() or 1)


def usages_json(targets: list[str]) -> dict:
    """Every launch compiled under this interpreter's triton for `targets`: the rows --json writes."""
    import triton

    start = time.perf_counter()
    usages = aot.all_usages(preset_kernel_shapes(), targets, _workers())
    return {"triton": triton.__version__, "python": sys.version.split()[0], "seconds": time.perf_counter() - start,
            "usages": [{"kernel": _kernel_name(u.launch.kernel), "preset": u.launch.preset, "shape": u.launch.shape,
                        "config": u.launch.config, "target": u.target.name, "shared": u.shared,
                        "registers": u.registers, "spill": u.spill, "programs_per_sm": u.programs_per_sm,
                        "programs": u.launch.programs, "waves": u.waves, "problems": list(u.problems)}
                       for u in usages]}


def run_in(python: str, targets: list[str]) -> dict:
    """usages_json() in another interpreter (its own triton and ptxas), with this repository on its path."""
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "usages.json"
        done = subprocess.run([python, str(Path(__file__).resolve()), "--json", str(target), "--targets", ",".join(targets)],
                              cwd=REPO_ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        if not target.is_file():
            raise RuntimeError(f"{python} bench/kernel_resources.py --json failed (exit {done.returncode}): "
                               f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        return json.loads(target.read_text())


def versions_table(ours: dict, theirs: dict) -> tuple[str, int]:
    """One row per sm_90 launch: shared KB / registers / spill under each triton, and what does not fit."""
    key = lambda u: (u["kernel"], u["preset"], u["shape"], u["config"])  # noqa: E731
    mine = {key(u): u for u in ours["usages"] if u["target"] == "sm_90"}
    other = {key(u): u for u in theirs["usages"] if u["target"] == "sm_90"}
    a, b = theirs["triton"], ours["triton"]
    header = ["kernel", "preset", "shape", "config", f"shared KB {a}", f"shared KB {b}", f"registers {a}",
              f"registers {b}", f"spill B {a}", f"spill B {b}", f"verdict {a}"]
    rows, misfits = [], 0
    for k in list(dict.fromkeys([*other, *mine])):
        u, v = other.get(k), mine.get(k)
        cell = lambda x, f: "-" if x is None else f(x)  # noqa: E731
        verdict = "not compiled" if u is None else ("; ".join(u["problems"]) or "fits")
        misfits += bool(u is None or u["problems"])
        rows.append((*k, cell(u, lambda x: f"{x['shared'] / 1024:.1f}"), cell(v, lambda x: f"{x['shared'] / 1024:.1f}"),
                     cell(u, lambda x: x["registers"]), cell(v, lambda x: x["registers"]), cell(u, lambda x: x["spill"]),
                     cell(v, lambda x: x["spill"]), verdict))
    return markdown_table(header, rows), misfits


def compare(python: str) -> int:
    """sm_90 under this triton and under `python`'s; prints the table and writes its docs/benchmarks.md section."""
    ours = usages_json(["sm_90"])
    theirs = run_in(python, ["sm_90"])
    table, misfits = versions_table(ours, theirs)
    changed = sum(1 for line in table.splitlines()[2:] if _differs(line))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                            text=True).stdout.strip()
    note = (f"Not measured on a GPU: every sm_90 launch of the section above compiled offline with Triton "
            f"{theirs['triton']} (the lent H200's version; interpreter {python}, Python {theirs['python']}: the "
            f"compile does not depend on Python's version) and with "
            f"Triton {ours['triton']}, each with its bundled ptxas and read with its cuobjdump, at commit {commit}. "
            f"Counted, not timed, so written at any load ({platform.node()}: {os.getloadavg()[0]:.1f}). "
            f"{len(theirs['usages'])} launches under {theirs['triton']}, {len(ours['usages'])} under {ours['triton']}; "
            f"{changed} differ in shared memory, registers or spill; {misfits} do not fit under {theirs['triton']} "
            f"(limits: 227 KB shared, 255 registers, the spill budgets of aot.GDN_SPILL_BUDGET / aot.ELEMENTWISE). "
            f"Made by `python bench/kernel_resources.py --triton-env /work/venvs/triton36/bin/python` "
            f"(the venv: `python3 -m venv /work/venvs/triton36 && /work/venvs/triton36/bin/pip install torch==2.13.0 "
            f"triton==3.6.0 numpy`; the same check is `python bench/gpu_check.py --preflight --triton-env PY`).")
    print(note)
    print(table)
    write_section(VERSIONS_TITLE, table, note)
    return 1 if misfits else 0


def _differs(line: str) -> bool:
    cells = [c.strip() for c in line.strip("|").split("|")]
    return cells[4] != cells[5] or cells[6] != cells[7] or cells[8] != cells[9]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write every usage under this interpreter's triton to this file (no docs)")
    parser.add_argument("--targets", default=",".join(aot.TARGETS), help="comma list of targets (sm_90, sm_80)")
    parser.add_argument("--triton-env", help="a python with another triton: compare its sm_90 compile with this one's")
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(targets) - set(aot.TARGETS))
    if unknown:
        parser.error(f"--targets {','.join(unknown)}: not a target ({', '.join(aot.TARGETS)})")
    if args.json:
        data = usages_json(targets)
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        misfits = sum(1 for u in data["usages"] if u["problems"])
        print(f"triton {data['triton']}: {len(data['usages'])} launches for {', '.join(targets)}, {misfits} do not fit")
        return 1 if misfits else 0
    if args.triton_env:
        return compare(args.triton_env)
    return resources_table()


def resources_table() -> int:
    import triton

    start = time.perf_counter()
    usages = aot.all_usages(preset_kernel_shapes(), list(aot.TARGETS), _workers())
    seconds = time.perf_counter() - start
    rows = [(_kernel_name(u.launch.kernel), u.launch.preset,
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

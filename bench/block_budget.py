"""The per-block-kind kernel and byte budget of hymo-750m's forward + backward at 2 x 4096, before and after.

    python bench/block_budget.py                      # this tree, with the budget column
    python bench/block_budget.py --before d120bf3     # and that commit's counts, from a temporary git worktree

Counting (hymo_core/train/block_budget.py) runs on the meta device, so the figures are exact counts, not
timings, and need no GPU or quiet machine. The "before" tree is checked out with `git worktree add` into a
temporary directory and counted in a child process whose hymo_core is that tree's, with this tree's counting
module loaded by path; the worktree is removed afterwards. Commits before the meta fix in
hymo_core/models/layers/moe.py (`compute_dtype` asked autocast about the meta device and raised) get that one
function shimmed to what the fix returns (the tensor's own dtype), so they can be counted at all.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTING = ROOT / "hymo_core" / "train" / "block_budget.py"

CHILD = """
import importlib.util, json, sys, torch
from hymo_core.models.layers import moe
try:
    moe.compute_dtype(torch.empty(1, device="meta"))
except RuntimeError:  # the parent's compute_dtype asked autocast about meta: shim it to the fix's answer
    moe.compute_dtype = lambda x: x.dtype
spec = importlib.util.spec_from_file_location("block_budget_counting", sys.argv[1])
counting = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = counting  # dataclasses look their module up there
spec.loader.exec_module(counting)
print(json.dumps({"units": [vars(u) for u in counting.count_units()], "optimizer": counting.count_optimizer_step(),
                  "qk_clip": counting.count_qk_clip()}))
"""


def count_at(rev: str) -> dict:
    """The units counted on commit `rev`, in a temporary worktree of this repository."""
    with tempfile.TemporaryDirectory(prefix="block_budget_") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            done = subprocess.run([sys.executable, "-c", CHILD, str(COUNTING)], cwd=tree, env=env, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"counting {rev} failed:\n{done.stderr[-3000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="REV", help="also count this commit (a temporary git worktree)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from hymo_core.train.block_budget import (BUDGET, BUDGET_BATCH, BUDGET_PRESET, BUDGET_SEQ, UnitCount, count_optimizer_step,
                                              count_qk_clip, count_units, format_table)

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"{BUDGET_PRESET}, {BUDGET_BATCH} x {BUDGET_SEQ}, forward + backward on the meta device (bf16 weights, grouped experts)")
    if args.before:
        counted = count_at(args.before)
        before = [UnitCount(**u) for u in counted["units"]]
        print(f"\nbefore ({args.before}):\n")
        print(format_table(before))
        print(f"\noptimizer step (steady state): {counted['optimizer'][0]:,} launches, {counted['optimizer'][1] / 1e9:.1f} GB")
        print(f"QK-Clip rescale, every softmax layer: {counted['qk_clip']} launches")
    after = count_units()
    print(f"\nafter ({head}{', uncommitted changes' if _dirty() else ''}):\n")
    print(format_table(after, BUDGET))
    optimizer = count_optimizer_step()
    print(f"\noptimizer step (steady state): {optimizer[0]:,} launches, {optimizer[1] / 1e9:.1f} GB")
    print(f"QK-Clip rescale, every softmax layer: {count_qk_clip()} launches")
    if args.before:
        old = {u.name: u for u in before}
        print("\n| unit | launches before -> after | GB moved before -> after (in model) |\n|---|---|---|")
        for u in after:
            o = old.get(u.name)
            if o is not None:
                print(f"| {u.name} | {o.per_model * o.launches:,} -> {u.per_model * u.launches:,} | "
                      f"{o.per_model * o.bytes_moved / 1e9:.1f} -> {u.per_model * u.bytes_moved / 1e9:.1f} |")


def _dirty() -> bool:
    return bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()

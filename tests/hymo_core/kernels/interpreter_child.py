"""Re-run a kernel test module in a child pytest under TRITON_INTERPRET=1 (imported by the test modules).

Triton reads TRITON_INTERPRET when it is imported and when each kernel is decorated, so a process
that may already hold compiled kernels cannot switch it on; a module whose kernels must run on a
machine without a GPU therefore runs itself again in a child, as test_kernels.py does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[3]
IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
RUN_HERE = torch.cuda.is_available() or IN_INTERPRETER


def run_module_in_interpreter(test_file: str, timeout: int = 600) -> str:
    """Run `test_file` with TRITON_INTERPRET=1; assert that everything but its launcher ran and passed."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(test_file).resolve())],
                           capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=timeout)
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-3000:]
    assert " passed" in summary and "failed" not in summary and "1 skipped" in summary, summary
    return child.stdout

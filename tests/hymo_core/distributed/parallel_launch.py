"""One 2-rank launch of parallel_checks.py per test session, shared by test_meta_init_launch.py and
test_expert_parallel.py: the first caller launches, the second reads the file it left."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hymo_core.distributed.launch import run_process_group

HERE = Path(__file__).resolve().parent


def parallel_checks(tmp_path_factory) -> dict:
    out = tmp_path_factory.getbasetemp() / "parallel-checks" / "ranks.json"
    if not out.is_file():
        out.parent.mkdir(exist_ok=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                   str(HERE / "parallel_checks.py"), str(out)]
        run_process_group(command, lambda line: None, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())

"""One 2-rank launch of parallel_checks.py serves test_meta_init_launch.py and test_expert_parallel.py."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from hymo_core.distributed.launch import run_process_group

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def parallel_checks(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("parallel-checks") / "ranks.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(HERE / "parallel_checks.py"), str(out)]
    run_process_group(command, lambda line: None, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())

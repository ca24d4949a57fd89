"""One torchrun launch (2 gloo ranks) for two sets of checks, since a launch is the slow part:
meta-device construction (meta_init_checks.py) and expert parallelism (expert_parallel_checks.py).
Rank 0 writes {"meta_init": [per rank], "expert_parallel": [per rank]} as JSON to argv[1].
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

import expert_parallel_checks
import meta_init_checks
from hymo_core.distributed.process_group import close_runtime, init_runtime


def main(out: str) -> None:
    runtime = init_runtime()
    results = {"meta_init": meta_init_checks.figures(runtime),
               "expert_parallel": expert_parallel_checks.figures(runtime, Path(out).parent)}
    gathered = [None] * runtime.world_size
    dist.all_gather_object(gathered, results)
    if runtime.is_writer:
        Path(out).write_text(json.dumps({key: [rank[key] for rank in gathered] for key in results}), encoding="utf-8")
    close_runtime(runtime)


if __name__ == "__main__":
    main(sys.argv[1])

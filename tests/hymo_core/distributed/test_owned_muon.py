"""Each Muon / NorMuon matrix orthogonalised once, by its owner rank (issue 24, part 1).

Under torchrun with 2 and 3 gloo ranks (uneven row shards, an empty one at 3), the
row-sharded optimizers must give the one-process update, and over all ranks every
matrix must have gone through Newton-Schulz exactly once per step.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from hymo_core.distributed.launch import run_process_group
from hymo_core.planner.muon import muon_update_cost, newton_schulz_flops, row_counts

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module", params=[2, 3])
def checks(request, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("owned") / "checks.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={request.param}",
               str(HERE / "owned_muon_checks.py"), str(out)]
    run_process_group(command, lambda line: None, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())


@pytest.mark.parametrize("optimizer", ["muon_adamw", "normuon", "normuon_momentum_norm"])
def test_row_sharded_update_equals_one_process(checks, optimizer):
    ranks = checks["results"][optimizer]
    assert len(ranks) == checks["world"]
    assert max(rank["difference"] for rank in ranks) < 1e-6
    if optimizer == "muon_adamw":  # the same addmm chain on the same whole matrix: bit for bit
        assert max(rank["difference"] for rank in ranks) == 0.0


@pytest.mark.parametrize("optimizer", ["muon_adamw", "normuon"])
def test_every_matrix_orthogonalised_once_over_the_ranks(checks, optimizer):
    ranks = checks["results"][optimizer]
    per_rank = [rank["orthogonalised"] for rank in ranks]
    assert sum(per_rank) == checks["matrices"] * checks["steps"]  # the gather scheme: world x this
    assert max(per_rank) <= math.ceil(checks["matrices"] / checks["world"]) * checks["steps"] + checks["steps"]
    rows = [[shape[0] for shape in rank["rows"]] for rank in ranks]
    assert len(set(map(tuple, rows))) > 1  # uneven shards
    if checks["world"] == 3:
        assert 0 in rows[2]  # a matrix of 2 rows leaves rank 2 without any


def test_row_counts_are_torch_chunk():
    import torch

    for rows in range(1, 30):
        for ranks in range(1, 7):
            chunks = [len(c) for c in torch.arange(rows).chunk(ranks)]
            assert row_counts(rows, ranks) == chunks + [0] * (ranks - len(chunks))


def test_update_cost_by_hand():
    """Two 4 x 6 matrices and one 2 x 3 on 2 ranks, one Newton-Schulz step, 4-byte rows."""
    shapes = [(4, 6), (4, 6), (2, 3)]
    assert newton_schulz_flops(4, 6, 1) == 2 * 16 * 6 + 2 * 64 + 2 * 16 * 6 == 512
    assert newton_schulz_flops(3, 2, 1) == 64  # orientation does not matter
    gather = muon_update_cost(shapes, 2, "gather", steps=1)
    owned = muon_update_cost(shapes, 2, "owned", steps=1, ns_bytes=4)
    assert (gather.ns_flops, gather.bytes_received, gather.collectives) == (1088, 108, 6)
    # Owners: the 4 x 6 pair on ranks 0 and 1, the 2 x 3 on rank 0 (the offset runs on).
    assert (owned.ns_flops, owned.bytes_received, owned.collectives) == (576, 108, 5)
    one = muon_update_cost(shapes, 1, "owned", steps=1)
    assert (one.ns_flops, one.bytes_received, one.collectives) == (1088, 0, 0)

"""The run's model is built on the meta device and materialised after FSDP2 sharding (issue 24, part 6).

Counted, not timed: under torchrun with 2 gloo ranks, every tensor created while a rank makes
its model is tracked (meta_init_checks.py, run by parallel_checks.py). The way `run_training` builds it never holds the
whole fp32 model: at its peak a rank holds its own shards plus one init unit's full values
(materialise_'s stand-ins). The eager path, for contrast, peaks above the full model. Both give
the same weights, and so the same loss and gradient norm on the same tokens.
"""
from __future__ import annotations

import pytest

from parallel_launch import parallel_checks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return parallel_checks(tmp_path_factory)["meta_init"]  # one 2-rank launch for this file and its neighbour


def test_no_rank_holds_the_whole_fp32_model(ranks):
    assert len(ranks) == 2
    for rank in ranks:
        assert rank["meta_held"] < 0.6 * rank["full_bytes"]  # its shards (plus buffers) only
        assert rank["meta_peak"] < rank["full_bytes"], rank
        assert rank["meta_peak"] <= rank["meta_held"] + 2 * rank["largest_unit"], rank  # shards + one unit in flight
        assert rank["eager_peak"] >= rank["full_bytes"], rank  # the counter sees a full model when there is one


def test_meta_init_trains_like_eager_init(ranks):
    for rank in ranks:
        assert rank["weights_equal"]
        assert rank["meta_loss"] == rank["eager_loss"]  # (loss, gradient norm), bit for bit

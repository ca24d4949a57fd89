"""The training step stays within its launch budget at the preset shapes (issue 53, part 3).

Counted on the meta device (hymo_core/train/launch_budget.py): forward, backward, the clip and the
optimizer of one dense-125m step at 8 x 2048, and the hybrids' optimizer step. The limits live in one
place, `LAUNCH_BUDGET`; a change that launches more kernels fails here until it raises them on purpose.
docs/benchmarks.md ("Training step launch budget") has the before and after of bench/launch_budget.py.
"""
import sys
from pathlib import Path

import pytest

from hymo_core.models.configs import SAMPLE_MODEL
from hymo_core.models.presets import PRESETS
from hymo_core.train.launch_budget import BUDGET_SHAPES, LAUNCH_BUDGET, LOGGING_BUDGET, MODEL_PHASES, count_step

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # bench/


@pytest.mark.parametrize("name", sorted(LAUNCH_BUDGET))
def test_step_launches_stay_within_the_budget(name):
    counted = count_step(name, PRESETS[name], *BUDGET_SHAPES[name], MODEL_PHASES[name])
    over = {phase: (n, LAUNCH_BUDGET[name][phase]) for phase, n in counted.launches.items() if n > LAUNCH_BUDGET[name][phase]}
    assert not over, f"{name}: launches over the budget (counted, budget): {over}"
    assert set(counted.launches) == set(LAUNCH_BUDGET[name])  # every budgeted phase was counted



@pytest.mark.parametrize("name", sorted(LOGGING_BUDGET))
def test_a_logging_step_launches_a_few_kernels_more_than_an_ordinary_one(name, one_torch_thread):
    """The weights' snapshot and the update ratios run as foreach ops per group, not a few ops per parameter
    (issue 53, part 7): a logging step's extra launches stay within LOGGING_BUDGET, whatever the depth."""
    from bench.trainer_step import logging_step_launches

    config = SAMPLE_MODEL if name == "sample-dense" else PRESETS[name]
    counted = logging_step_launches(config, "hymo-tiny")  # the presets' [train] defaults (NorMuon, cautious decay)
    assert counted["logging_extra"] <= LOGGING_BUDGET[name], counted
    assert counted["record"] >= 0 and counted["snapshot_and_ratios"] > 0  # the windows isolate what logging adds

"""The training step stays within its launch budget at the preset shapes (issue 53, part 3).

Counted on the meta device (hymo_core/train/launch_budget.py): forward, backward, the clip and the
optimizer of one dense-125m step at 8 x 2048, and the hybrids' optimizer step. The limits live in one
place, `LAUNCH_BUDGET`; a change that launches more kernels fails here until it raises them on purpose.
docs/benchmarks.md ("Training step launch budget") has the before and after of bench/launch_budget.py.
"""
import pytest

from hymo_core.models.presets import PRESETS
from hymo_core.train.launch_budget import BUDGET_SHAPES, LAUNCH_BUDGET, MODEL_PHASES, count_step


@pytest.mark.parametrize("name", sorted(LAUNCH_BUDGET))
def test_step_launches_stay_within_the_budget(name):
    counted = count_step(name, PRESETS[name], *BUDGET_SHAPES[name], MODEL_PHASES[name])
    over = {phase: (n, LAUNCH_BUDGET[name][phase]) for phase, n in counted.launches.items() if n > LAUNCH_BUDGET[name][phase]}
    assert not over, f"{name}: launches over the budget (counted, budget): {over}"
    assert set(counted.launches) == set(LAUNCH_BUDGET[name])  # every budgeted phase was counted


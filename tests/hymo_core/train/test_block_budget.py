"""Each block kind of hymo-750m stays within its written kernel and byte budget (issue 54).

Counted on the meta device at the preset's real shapes (2 x 4096), forward + backward, by
hymo_core/train/block_budget.py; the limits are its `BUDGET`, the one place they are written (the
table in docs/benchmarks.md is bench/block_budget.py's print of the same counts).
"""
import pytest

from hymo_core.train.block_budget import BUDGET, count_units


@pytest.fixture(scope="module")
def units():
    return {u.name: u for u in count_units()}


def test_every_unit_has_a_budget(units):
    assert sorted(units) == sorted(BUDGET)


@pytest.mark.parametrize("name", list(BUDGET))
def test_unit_within_its_budget(units, name):
    launches, bytes_moved = BUDGET[name]
    unit = units[name]
    assert unit.launches <= launches, f"{name}: {unit.forward} + {unit.backward} launches, budget {launches}"
    assert unit.bytes_moved <= bytes_moved, f"{name}: {unit.bytes_moved:,} bytes, budget {bytes_moved:,}"


def test_units_add_up_to_the_model(units):
    """The rest is what no unit holds (embedding, norms, residuals, main head): small against the model.

    (A quarter, not an eighth: as the units shrink, GDN's fused short conv first, the fixed rest's share grows.)"""
    model, rest = units["model"], units["rest"]
    assert 0 < rest.forward and 0 < rest.backward and 0 < rest.bytes_moved
    assert rest.launches < model.launches / 4

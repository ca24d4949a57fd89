"""learning_rate_at_step: one-based, absolute, and indifferent to session boundaries."""

import math

import pytest

from hymo_core.train.schedule import ScheduleConfig, learning_rate_at_step

PEAK = 3e-4


def test_rejects_step_zero_and_non_integers():
    config = ScheduleConfig(peak_lr=PEAK, warmup_steps=10)
    for bad in (0, -1):
        with pytest.raises(ValueError):
            learning_rate_at_step(config, bad)
    for bad in (1.0, True, "3"):
        with pytest.raises(TypeError):
            learning_rate_at_step(config, bad)


def test_linear_warmup_reaches_peak_on_its_last_step():
    config = ScheduleConfig(peak_lr=PEAK, warmup_steps=4)
    assert [learning_rate_at_step(config, s) for s in range(1, 7)] == pytest.approx(
        [PEAK / 4, PEAK / 2, 3 * PEAK / 4, PEAK, PEAK, PEAK]
    )


def test_no_warmup_starts_at_peak():
    assert learning_rate_at_step(ScheduleConfig(peak_lr=PEAK), 1) == PEAK


def test_cosine_runs_from_peak_to_floor_and_stays_there():
    config = ScheduleConfig(peak_lr=PEAK, warmup_steps=10, kind="cosine", horizon_steps=110, min_lr_ratio=0.1)
    assert learning_rate_at_step(config, 10) == pytest.approx(PEAK)
    assert learning_rate_at_step(config, 60) == pytest.approx(0.1 * PEAK + 0.9 * PEAK / 2)
    assert learning_rate_at_step(config, 110) == pytest.approx(0.1 * PEAK)
    assert learning_rate_at_step(config, 500) == pytest.approx(0.1 * PEAK)
    rates = [learning_rate_at_step(config, s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


@pytest.mark.parametrize(
    "shape, halfway",
    [("linear", 0.5), ("cosine", 0.5), ("sqrt", math.sqrt(0.5))],
)
def test_wsd_holds_then_decays_with_the_chosen_shape(shape, halfway):
    config = ScheduleConfig(peak_lr=PEAK, warmup_steps=20, kind="wsd", horizon_steps=1000, decay_steps=200,
                            decay_shape=shape, min_lr_ratio=0.05)
    assert learning_rate_at_step(config, 21) == PEAK
    assert learning_rate_at_step(config, 800) == PEAK  # last stable step
    floor = 0.05 * PEAK
    assert learning_rate_at_step(config, 900) == pytest.approx(floor + (PEAK - floor) * halfway)
    assert learning_rate_at_step(config, 1000) == pytest.approx(floor)
    assert learning_rate_at_step(config, 1200) == pytest.approx(floor)


def test_wsd_shapes_differ_inside_the_decay():
    rates = {
        shape: learning_rate_at_step(
            ScheduleConfig(peak_lr=PEAK, kind="wsd", horizon_steps=100, decay_steps=50, decay_shape=shape), 60
        )
        for shape in ("linear", "cosine", "sqrt")
    }
    # 20% into the decay: cosine 0.905, sqrt 0.894, linear 0.8 of the way from floor to peak.
    assert rates["cosine"] > rates["sqrt"] > rates["linear"]


@pytest.mark.parametrize(
    "config",
    [
        ScheduleConfig(peak_lr=PEAK, warmup_steps=7, kind="cosine", horizon_steps=60),
        ScheduleConfig(peak_lr=PEAK, warmup_steps=7, kind="wsd", horizon_steps=60, decay_steps=15,
                       decay_shape="sqrt"),
    ],
)
def test_sessions_never_restart_warmup(config):
    """A run interrupted at arbitrary points sees exactly the uninterrupted run's rates."""
    uninterrupted = [learning_rate_at_step(config, step) for step in range(1, 61)]
    seen, step = [], 0  # `step` is the restored successful-step counter
    for session_max_steps in (3, 11, 12, 40, 60):  # each session resumes from a checkpoint
        while step < session_max_steps:
            seen.append(learning_rate_at_step(config, step + 1))
            step += 1
    assert seen == uninterrupted
    assert seen[3] == uninterrupted[3] > seen[0]  # session 2 did not start a new warmup


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kind="linear"),
        dict(kind="cosine", horizon_steps=5, warmup_steps=5),
        dict(kind="wsd", horizon_steps=100, decay_steps=0),
        dict(kind="wsd", horizon_steps=100, warmup_steps=10, decay_steps=95),
        dict(decay_shape="exp"),
        dict(min_lr_ratio=1.5),
        dict(warmup_steps=-1),
    ],
)
def test_invalid_configs_are_rejected(kwargs):
    with pytest.raises(ValueError):
        ScheduleConfig(peak_lr=PEAK, **kwargs)

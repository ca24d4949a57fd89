"""The loss forecast: recovers a known power law, shrugs off a spike, and its band covers what comes next."""
from __future__ import annotations

import numpy as np
import pytest

from hymo_core.train.forecast import MIN_POINTS, bootstrap, fit_power_law, forecast_loss, observed_band


def curve(tokens, l_inf=2.0, a=5.0, gamma=0.4, unit=1e5):
    return l_inf + a * (np.asarray(tokens) / unit) ** -gamma


def test_fit_recovers_a_known_law_despite_one_spike():
    tokens = np.linspace(1e5, 2e6, 30)
    losses = curve(tokens) + np.random.default_rng(1).normal(0, 0.005, 30)
    losses[10] += 0.8  # a spike that a least-squares fit would chase
    fit = fit_power_law(tokens, losses)
    assert fit.gamma == pytest.approx(0.4, abs=0.05)
    assert fit(4e6) == pytest.approx(curve(4e6), abs=0.02)


def test_forecast_of_the_second_half_from_the_first_lies_in_its_band():
    tokens = np.linspace(1e5, 2e6, 30)
    losses = curve(tokens) + np.random.default_rng(2).normal(0, 0.005, 30)
    result, fits = forecast_loss(tokens[:15], losses[:15], tokens[-1], samples=60)
    assert result.low <= curve(tokens[-1]) <= result.high or abs(result.forecast - curve(tokens[-1])) < 0.03
    assert result.low <= result.forecast <= result.high
    assert len(result.residuals) == 15 and abs(np.median(result.residuals)) < 0.01
    assert [w["points"] for w in result.window_sensitivity] == [15, 11, 8]
    low, high = fits.band(tokens[16])
    assert low <= losses[16] <= high


def test_band_needs_enough_points_and_flags_a_jump():
    tokens = list(np.linspace(1e5, 1e6, 8))
    losses = list(curve(tokens))
    assert observed_band(tokens[:MIN_POINTS], losses[:MIN_POINTS], tokens[MIN_POINTS]) is None
    low, high = observed_band(tokens[:7], losses[:7], tokens[7], samples=40)
    assert low <= losses[7] <= high
    assert not low <= losses[7] + 1.0 <= high  # a regression of one nat leaves the band
    with pytest.raises(ValueError, match="needs >= 4"):
        fit_power_law([1, 2, 3], [3.0, 2.0, 1.0])


def test_no_forecast_from_too_few_evaluations_or_of_an_observed_point():
    from hymo_core.train.forecast import MIN_FORECAST_POINTS, forecast_if_due

    tokens = list(np.linspace(1e5, 1e6, 8))
    losses = list(curve(tokens) + np.random.default_rng(3).normal(0, 0.01, 8))
    assert MIN_FORECAST_POINTS == 6
    # the sample's case: 4 evaluations, 3 parameters, the target being the last of them
    assert forecast_if_due(tokens[:4], losses[:4], 2e6) is None
    assert forecast_if_due(tokens[:5], losses[:5], 2e6) is None
    assert forecast_if_due(tokens, losses, tokens[-1]) is None  # already observed
    assert forecast_if_due(tokens, losses, tokens[3]) is None
    with pytest.raises(ValueError, match="already observed"):
        forecast_loss(tokens, losses, tokens[-1])
    result, _ = forecast_if_due(tokens[:6], losses[:6], 2e6, samples=40)
    assert result.points == 6 and result.high - result.low > 0.01  # six noisy points do not make a certain forecast
    assert observed_band(tokens[:5], losses[:5], tokens[5]) is None


def test_band_covers_the_held_out_tail_at_its_stated_rate():
    """90 % bands fitted on 6 evaluations (the fewest that get one) of noisy power-law runs (noise 0.01 nats), checked on the
    next 6: they hold about 90 % of the held-out points and stay informative (the pair bootstrap they replace held 95 %
    with a median width of 0.39 nats, 39 times the noise)."""
    inside = total = 0
    widths = []
    for seed in range(30):
        rng = np.random.default_rng(100 + seed)
        tokens = np.linspace(1e5, 2e6, 16)
        losses = curve(tokens, l_inf=1.5 + rng.uniform(0, 1), gamma=rng.uniform(0.25, 0.6)) + rng.normal(0, 0.01, 16)
        fits = bootstrap(tokens[:6], losses[:6], samples=60, seed=seed)
        for t, observed in zip(tokens[6:12], losses[6:12]):
            low, high = fits.band(t)
            inside += low <= observed <= high
            total += 1
            widths.append(high - low)
    assert 0.8 <= inside / total <= 0.98, inside / total
    assert np.median(widths) < 0.15, np.median(widths)


def test_the_outside_forecast_alert_rarely_fires_on_healthy_runs_and_fires_on_a_regression():
    """Every evaluation from the 7th on is judged: the alert reads the 99 % band, so healthy noise flags about 1 in 100."""
    from hymo_core.train.alerts import AlertBook, AlertRule

    checked = fired = caught = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        tokens = np.linspace(5e4, 2e6, 20)
        l_inf, gamma = 1.5 + rng.uniform(0, 1), rng.uniform(0.25, 0.6)
        losses = curve(tokens, l_inf=l_inf, gamma=gamma) + rng.normal(0, 0.01, 20)
        book = AlertBook((AlertRule("val_loss", "outside_forecast"),))
        for step, (t, loss) in enumerate(zip(tokens, losses), 1):
            firings = book.check_record({"val_loss": float(loss), "tokens_seen": float(t)}, step=step * 10)
            checked += step > 6
            fired += len(firings)
        regression = float(curve(2.1e6, l_inf=l_inf, gamma=gamma)) + 0.2  # 20 noise sigmas up: data or optimisation trouble
        firing, = book.check_record({"val_loss": regression, "tokens_seen": 2.1e6}, step=210)
        caught += firing.step == 210 and firing.alert == "val_loss outside_forecast"
    assert fired / checked < 0.03, (fired, checked)
    assert caught == 12


def test_a_held_out_loss_below_the_band_is_a_note_and_one_above_it_alerts():
    """Issue 58: the 400-update sample run raised two 'outside the forecast band' alerts for a loss that fell *below* the band.
    The forecast alert is one-sided; good news is a note (kind "note"), a divergence above the band still warns."""
    from hymo_core.train.alerts import DEFAULT_ALERTS, AlertBook

    tokens = np.linspace(5e4, 2e6, 10)
    losses = curve(tokens, l_inf=2.0, gamma=0.4) + np.random.default_rng(0).normal(0, 0.01, 10)
    for surprise, severity in ((-0.3, "info"), (+0.3, "warning")):
        book = AlertBook(DEFAULT_ALERTS, {"ln_vocab": 9.0, "tau": 100.0})
        for step, (t, loss) in enumerate(zip(tokens, losses), 1):
            assert book.check_record({"val_loss": float(loss), "tokens_seen": float(t)}, step=step * 50) == []
        expected = float(curve(2.2e6, l_inf=2.0, gamma=0.4))
        firing, = book.check_record({"val_loss": expected + surprise, "tokens_seen": 2.2e6}, step=550)
        assert (firing.severity, firing.alert, firing.step) == (severity, "held-out loss above the forecast band", 550)
        assert firing.to_record()["kind"] == ("note" if severity == "info" else "alert")
        if severity == "info":
            assert "below the forecast band" in firing.note

"""`--set` range-checked, keys a quality profile shadows named, and "did you mean" for a key one table too high or a
source spec's typo (issue 58). Each failing case ends in one line before Prefect or torch is imported."""
from __future__ import annotations

from pathlib import Path

import pytest

from flows.preflight import PreflightError, check_pipeline_config
from tests.flows.test_preflight import fails_early, spec


def test_out_of_range_values_are_refused_in_one_line(tmp_path: Path) -> None:
    line = fails_early(["run", "--set", "quality.min_words=-5", "--out", "run"], tmp_path)
    assert "--set quality.min_words=-5" in line and "cannot be negative" in line
    line = fails_early(["run", "--set", "quality.max_duplicate_line_fraction=1.5", "--out", "run"], tmp_path)
    assert "a fraction, at most 1" in line
    line = fails_early(["train", "--corpus", ".", "--out", "out", "--set", "train.warmup_steps=-3"], tmp_path)
    assert "--set train.warmup_steps=-3" in line and "cannot be negative" in line


def test_a_config_file_out_of_range_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "pipeline.toml").write_text('[quality]\nmin_words = 500\nmax_words = 100\n', encoding="utf-8")
    with pytest.raises(PreflightError, match="min_words = 500 is above max_words = 100"):
        check_pipeline_config(str(tmp_path / "pipeline.toml"), None)
    (tmp_path / "pipeline.toml").write_text('[quality.profiles.web]\nmin_words = -1\n', encoding="utf-8")
    with pytest.raises(PreflightError, match=r"quality.profiles.web.min_words = -1: must be >= 0"):
        check_pipeline_config(str(tmp_path / "pipeline.toml"), None)


def test_a_key_a_quality_profile_keeps_is_named(capsys) -> None:
    from flows.preflight import shadowed_overrides

    config = check_pipeline_config(None, ["quality.min_words=40"])
    assert config.quality.min_words == 40
    note = capsys.readouterr().err
    assert "hymo: note: --set quality.min_words=40 does not reach every quality profile: documentation keeps 30" in note
    assert shadowed_overrides(config, ["quality.max_words=90000"]) == []  # no profile keeps its own max_words


def test_a_key_one_table_too_high_points_to_where_it_lives(tmp_path: Path) -> None:
    line = fails_early(["run", "--set", "pretrain.max_steps=5", "--out", "run"], tmp_path)
    assert "did you mean 'pretrain.train.max_steps'" in line


def test_unknown_source_spec_keys_get_did_you_mean(tmp_path: Path) -> None:
    spec(tmp_path / "mine.toml", licence="cc0")
    (tmp_path / "data").mkdir()
    (tmp_path / "pipeline.toml").write_text('[run]\nsources = ["mine.toml"]\n', encoding="utf-8")
    line = fails_early(["run", "--config", "pipeline.toml", "--out", "run"], tmp_path)
    assert "unknown keys ['licence']" in line and "did you mean 'licence' -> 'license'?" in line

"""One source of defaults, without a server: the `hymo-pipeline` flow's own defaults and `hymo serve`'s
deployment parameters are `hymo run`'s (the bundled sample config), and the run directory is absolute,
under HYMO_HOME or the directory `hymo serve` was given, wherever the command was started.
(tests/flows/test_ui.py checks the same against a real server, a real `hymo run` and Chromium.)"""
from __future__ import annotations

from pathlib import Path

from prefect.utilities.callables import parameter_schema

from flows.cli import build_parser
from flows.config import PipelineConfig, default_run, load_config
from flows.pipeline import hymo_pipeline
from flows.serve import build_deployments


def test_the_flows_own_config_default_is_the_sample_config_not_the_class_defaults() -> None:
    schema = parameter_schema(hymo_pipeline).properties
    sample = load_config().model_dump(mode="json")
    assert schema["config"]["default"] == sample
    assert sample["quality_model"]["enabled"] is True and PipelineConfig().quality_model.enabled is False
    assert build_parser().parse_args(["run"]).config is None  # `hymo run` reads load_config(None): the same sample config


def test_served_defaults_are_absolute_and_follow_hymo_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYMO_HOME", raising=False)
    assert default_run() == tmp_path.resolve() / "runs" / "sample"
    home = tmp_path / "home"
    monkeypatch.setenv("HYMO_HOME", str(home))
    assert default_run() == home.resolve() / "runs" / "sample"

    (full, rerun, train, cpt, ablate) = build_deployments(Path("relative-root"))  # --run-root as typed: made absolute
    expected = str(tmp_path.resolve() / "relative-root" / "sample")
    assert full.parameters == {"config": load_config().model_dump(mode="json"), "out": expected}
    assert rerun.parameters == {"run": expected} and train.parameters == {"corpus": expected} and cpt.parameters == {"general": expected}
    assert ablate.parameters["base_run"] == expected
    assert ablate.parameters["out"] == str(tmp_path.resolve() / "relative-root" / "ablate-sample")
    assert all(Path(value).is_absolute() for value in (ablate.parameters["spec"], ablate.parameters["out"]))
    assert expected in full.description and "sample.toml" in full.description

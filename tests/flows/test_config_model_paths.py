"""Relative paths (models, plugin directories, the config directory, source specs) are resolved on the flow host, so a
worker in another working directory opens the same file."""
from __future__ import annotations

import os
from pathlib import Path

from flows.config import PipelineConfig, load_config


def test_relative_model_paths_resolve_against_the_config_directory(tmp_path):
    (tmp_path / "configs").mkdir()
    config_file = tmp_path / "configs" / "run.toml"
    config_file.write_text('[langid]\nmodel_path = "models/lid.bin"\n\n[quality_model]\nmodel_path = "../shared/hq.bin"\n', encoding="utf-8")
    config = load_config(config_file)
    assert config.langid.model_path == str(tmp_path / "configs" / "models" / "lid.bin")
    assert config.quality_model.model_path == str(tmp_path / "shared" / "hq.bin")


def test_without_a_config_directory_the_flow_hosts_working_directory_is_the_base(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = PipelineConfig(langid={"model_path": "lid.bin"})
    assert config.langid.model_path == str(tmp_path.resolve() / "lid.bin")
    os.chdir("/")  # a worker elsewhere sees the same absolute path in the config it is handed
    assert Path(PipelineConfig(**config.model_dump(mode="json")).langid.model_path) == tmp_path.resolve() / "lid.bin"


def test_absent_and_absolute_model_paths_are_left_as_they_are(tmp_path):
    config = PipelineConfig(quality_model={"model_path": str(tmp_path / "m.bin")})
    assert config.langid.model_path == "" and config.quality_model.model_path == str(tmp_path / "m.bin")


def test_config_directory_plugin_directories_and_source_specs_become_absolute(tmp_path, monkeypatch):
    from conftest import write_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    write_spec(tmp_path / "specs", "notes", "text_dir", "notes")
    config = PipelineConfig(config_dir="conf", sources=["specs/notes.toml"],
                            filters=[{"name": "mine", "after": "quality", "function": "plugins_mod:keep", "path": "plugins"}])
    assert config.config_dir == str(tmp_path / "conf") and config.filters[0].path == str(tmp_path / "conf" / "plugins")
    spec = PipelineConfig(sources=["specs/notes.toml"]).source_specs()[0]  # no config directory: against the working directory
    os.chdir("/")
    assert spec.root == tmp_path / "specs" / "notes"

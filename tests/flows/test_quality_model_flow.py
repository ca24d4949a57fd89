"""The classifier stage and a user filter stage inside the Prefect flow: placed in the run, in the funnel,
explained by `hymo audit why`, and a plugin that cannot be imported stops the run before any stage."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_sources

from flows.cli import main
from flows.config import PipelineConfig
from flows.pipeline import hymo_pipeline
from tasks.filters.user_filter import UserFilterConfig, UserFilterError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore. " * 5


def config_for(root: Path, function: str = "my_filters:no_lorem") -> PipelineConfig:
    specs = write_sources(root / "sources")
    (root / "sources" / "prose" / "docs.jsonl").open("a", encoding="utf-8").write(json.dumps({"url": "https://prose.example/lorem", "text": LOREM}) + "\n")
    return PipelineConfig(
        sources=[str(s) for s in specs], workers=2, langid={"langs": ["*"], "min_score": 0.3},
        quality={"min_words": 20, "c4_min_sentences": 1, "min_stop_words": 1},
        # Random-word test documents are far from Wikipedia: a high threshold makes the sample classifier remove some.
        quality_model={"enabled": True, "threshold": 0.9, "sources": ["prose"], "langs": ["*"]},
        filters=[UserFilterConfig(name="no_lorem", after="langid", function=function, path=str(EXAMPLES))],
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory, prefect_harness) -> Path:
    root = tmp_path_factory.mktemp("qm-flow")
    hymo_pipeline(config=config_for(root), out=str(root / "run"), until="quality_model")
    return root / "run"


def test_classifier_and_plugin_stages_run_in_the_flow(run: Path, capsys) -> None:
    assert sorted(p.name for p in run.glob("0*_*")) == ["01_ingest", "02_extract", "03_langid", "03a_no_lorem", "04_quality", "05_quality_model"]
    assert main(["audit", "summary", str(run), "--json"]) == 0
    funnel = {row["stage"]: row for row in json.loads(capsys.readouterr().out)}
    assert funnel["no_lorem"]["removed"] == {"no_lorem_placeholder_text": 1}
    removed = funnel["quality_model"]["removed"].get("quality_model_low_score", 0)
    assert removed > 0 and funnel["quality_model"]["kept"] + removed == funnel["quality_model"]["in"]

    assert main(["audit", "sample", str(run), "--stage", "quality_model", "--json", "-n", "1"]) == 0
    doc_id = json.loads(capsys.readouterr().out)[0]["id"]
    assert main(["audit", "why", str(run), doc_id]) == 0
    why = capsys.readouterr().out
    assert "quality_model_low_score value=" in why and "threshold=0.9" in why


def test_an_unimportable_plugin_stops_the_run_before_any_stage(tmp_path: Path, prefect_harness) -> None:
    with pytest.raises(UserFilterError, match="cannot import module 'not_a_module'"):
        hymo_pipeline(config=config_for(tmp_path, "not_a_module:decide"), out=str(tmp_path / "run"))
    assert not list((tmp_path / "run").glob("0*_*"))

"""User-defined filter stages: the examples/ plugin under the stage contract, and every way a plugin can fail."""
from __future__ import annotations

from pathlib import Path

import pytest

from manifests.schema import docs_table
from manifests.stage_manifest import StageNotComplete, read_manifest
from tasks.runner.stage_runner import StageWriter, read_stage_audit, read_stage_docs, run_stage
from tasks.filters.user_filter import UserFilterConfig, UserFilterError, user_filter_stage

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 4
PROSE = "The committee met on Tuesday to discuss how the river basin should be restored over the next ten years."


def publish_upstream(out: Path, texts: list[str]) -> Path:
    writer = StageWriter("quality", "1", {}, "key", [], out)
    half = len(texts) // 2
    for shard, chunk in enumerate((texts[:half], texts[half:])):
        writer.write_shard(shard, docs_table([{"id": f"doc-{shard}-{i}", "text": t, "source": "s", "url": "", "meta": {"profile": "prose"}}
                                              for i, t in enumerate(chunk)]), [])
    writer.publish()
    return out


def plugin(tmp_path: Path, module: str, body: str) -> UserFilterConfig:
    (tmp_path / f"{module}.py").write_text("from tasks.filters.user_filter import Decision\n\n" + body, encoding="utf-8")
    return UserFilterConfig(name=module, after="quality", function=f"{module}:decide", path=str(tmp_path))


def test_example_plugin_runs_under_the_stage_contract(tmp_path):
    upstream = publish_upstream(tmp_path / "04_quality", [PROSE, LOREM, PROSE + " " + PROSE, LOREM + PROSE])
    config = UserFilterConfig(name="no_lorem", after="quality", function="my_filters:no_lorem", path=str(EXAMPLES))
    manifest = run_stage(user_filter_stage(config), config, upstream, tmp_path / "05_no_lorem", workers=1)
    assert manifest.counts["in"] == 4 and manifest.counts["kept"] == 2 and manifest.counts["removed"] == {"no_lorem_placeholder_text": 2}
    audit = read_stage_audit(tmp_path / "05_no_lorem").to_pylist()
    assert {r["stage"] for r in audit} == {"no_lorem"} and all(r["value"] > r["threshold"] == 1.0 for r in audit)
    assert {d["text"] for d in read_stage_docs(tmp_path / "05_no_lorem").to_pylist()} == {PROSE, PROSE + " " + PROSE}
    assert any(i.get("file") == "filter:my_filters:no_lorem" for i in manifest.inputs)  # the source digest is a cache-key input


def test_editing_the_plugin_recomputes_the_stage(tmp_path):
    upstream = publish_upstream(tmp_path / "04_quality", [PROSE, LOREM])
    config = plugin(tmp_path, "edited_filter", "def decide(text, meta):\n    return Decision(True)\n")
    first = run_stage(user_filter_stage(config), config, upstream, tmp_path / "05_f", workers=1)
    assert run_stage(user_filter_stage(config), config, upstream, tmp_path / "05_f", workers=1).cache_key == first.cache_key
    (tmp_path / "edited_filter.py").write_text("from tasks.filters.user_filter import Decision\n\ndef decide(text, meta):\n    return Decision(True)  # edited\n")
    import importlib, sys
    importlib.reload(sys.modules["edited_filter"])
    assert run_stage(user_filter_stage(config), config, upstream, tmp_path / "05_f", workers=1).cache_key != first.cache_key


def test_a_plugin_that_raises_fails_its_stage_naming_plugin_document_and_error(tmp_path):
    upstream = publish_upstream(tmp_path / "04_quality", [PROSE, PROSE, LOREM, PROSE])
    config = plugin(tmp_path, "raising_filter", "def decide(text, meta):\n    if 'Lorem' in text:\n        raise KeyError('lang')\n    return Decision(True)\n")
    with pytest.raises(UserFilterError, match=r"'raising_filter'.*document doc-1-0: KeyError: 'lang'"):
        run_stage(user_filter_stage(config), config, upstream, tmp_path / "05_raising_filter", workers=1)
    with pytest.raises(StageNotComplete):
        read_manifest(tmp_path / "05_raising_filter")
    assert not list(tmp_path.glob(".05_raising_filter*"))  # the work directory was removed too: nothing partial


WRONG_TYPE = r"returned .* for document doc-0-0; it must return tasks.filters.user_filter.Decision"
NOT_A_BOOL = r"returned Decision\(keep=.* for document doc-0-0; keep must be True or False"  # Decision(keep="no") is truthy


@pytest.mark.parametrize("returned, message", [("True", WRONG_TYPE), ("(False, 'rule')", WRONG_TYPE), ("None", WRONG_TYPE),
                                               ("Decision('no', 'rule')", NOT_A_BOOL), ("Decision(0, 'rule')", NOT_A_BOOL),
                                               ("Decision(1, 'rule')", NOT_A_BOOL), ("Decision(None, 'rule')", NOT_A_BOOL),
                                               ("Decision([], 'rule')", NOT_A_BOOL)])
def test_a_wrong_answer_is_an_error_naming_the_plugin_and_nothing_is_published(tmp_path, returned, message):
    upstream = publish_upstream(tmp_path / "04_quality", [PROSE, LOREM])
    module = f"wrong_{abs(hash(returned))}"
    config = plugin(tmp_path, module, f"def decide(text, meta):\n    return {returned}\n")
    with pytest.raises(UserFilterError, match=rf"'{module}'.*{message}"):
        run_stage(user_filter_stage(config), config, upstream, tmp_path / "05_wrong", workers=1)
    with pytest.raises(StageNotComplete):
        read_manifest(tmp_path / "05_wrong")


def test_an_unimportable_plugin_fails_before_any_stage(tmp_path):
    from flows.config import PipelineConfig
    from flows.stages import pipeline_stages

    for function, message in (("no_such_module_xyz:decide", "cannot import module 'no_such_module_xyz'"), ("my_filters:missing", "has no function 'missing'"),
                              ("my_filters", "must read 'module:function'")):
        config = PipelineConfig(filters=[UserFilterConfig("mine", "quality", function, str(EXAMPLES))])
        with pytest.raises(UserFilterError, match=message):
            pipeline_stages(config)
    with pytest.raises(UserFilterError, match="not a document stage"):
        pipeline_stages(PipelineConfig(filters=[UserFilterConfig("mine", "tokenizer", "my_filters:no_lorem", str(EXAMPLES))]))


def test_filters_take_their_place_in_the_stage_list():
    from flows.config import PipelineConfig
    from flows.stages import pipeline_stages, stage_path

    config = PipelineConfig(filters=[UserFilterConfig("no_lorem", "quality", "my_filters:no_lorem", str(EXAMPLES)),
                                     UserFilterConfig("second", "no_lorem", "my_filters:no_lorem", str(EXAMPLES))])
    names = [e.name for e in pipeline_stages(config)]
    assert names[names.index("quality"):names.index("quality") + 4] == ["quality", "no_lorem", "second", "pii"]
    # built-in stages keep their number with or without the filters (and quality_model); a filter takes a letter
    assert [stage_path(Path("run"), n, config).name for n in ("quality", "no_lorem", "second", "pii")] == \
        ["04_quality", "04a_no_lorem", "04b_second", "06_pii"]
    assert stage_path(Path("run"), "pii", PipelineConfig()).name == "06_pii"

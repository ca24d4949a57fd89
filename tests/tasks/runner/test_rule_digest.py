"""Staleness: a changed rule recomputes its stage and every stage after it; nothing else."""
from __future__ import annotations

from pathlib import Path

import pytest

from manifests.stage_manifest import read_manifest
from tasks.runner import rule_digest as rules
from tasks.filters.pii import PiiConfig, run_pii
from tasks.corpus.split import SplitConfig, run_split


@pytest.fixture
def edited_sources(monkeypatch):
    """Pretend a module's source on disk changed: {module name: text appended to it}."""
    edits: dict[str, str] = {}
    real = rules.module_source

    def patched(name: str) -> str | None:
        source = real(name)
        return source + edits[name] if name in edits and source is not None else source

    monkeypatch.setattr(rules, "module_source", patched)

    def edit(name: str, extra: str) -> None:
        edits[name] = extra
        rules.parsed_module.cache_clear()
        rules.rule_digest.cache_clear()

    yield edit
    rules.parsed_module.cache_clear()
    rules.rule_digest.cache_clear()


def stamp(stage_dir: Path) -> tuple[str, int]:
    return read_manifest(stage_dir).cache_key, (stage_dir / "manifest.json").stat().st_mtime_ns


def test_a_stage_depends_on_its_module_and_what_that_imports() -> None:
    assert "tasks.ingest.decoding" in rules.rule_modules("ingest") and "tasks.ingest.source_walk" in rules.rule_modules("ingest")
    assert "hymo_core.train.trainer" in rules.rule_modules("pretrain") and "tasks.runner.stage_runner" not in rules.rule_modules("pretrain")
    assert "tasks.ingest.extract_page" in rules.rule_modules("extract")  # imported only inside the child: still found
    assert rules.rule_modules("no_such_stage") == [] and rules.rule_digest("no_such_stage") == ""


def test_comments_do_not_count_but_code_does(edited_sources) -> None:
    before = rules.rule_digest("ingest")
    edited_sources("tasks.ingest.decoding", "\n# a comment about the decoder\n")
    assert rules.rule_digest("ingest") == before
    edited_sources("tasks.ingest.decoding", "\nUTF8_MIN_DECODED_SHARE = 0.98\n")
    assert rules.rule_digest("ingest") != before


def test_changed_rule_recomputes_its_stage_and_what_follows(upstream, tmp_path: Path, edited_sources) -> None:
    ingest = upstream({f"d{i}": f"Write to person{i}@example.org about the mill. " * 3 for i in range(12)})
    run_pii(PiiConfig(), ingest, tmp_path / "pii", workers=1)
    run_split(SplitConfig(validation_fraction=0.25), tmp_path / "pii", tmp_path / "split", workers=1)
    pii_0, split_0 = stamp(tmp_path / "pii"), stamp(tmp_path / "split")

    run_pii(PiiConfig(), ingest, tmp_path / "pii", workers=1)  # nothing changed: both served from the run directory
    run_split(SplitConfig(validation_fraction=0.25), tmp_path / "pii", tmp_path / "split", workers=1)
    assert (stamp(tmp_path / "pii"), stamp(tmp_path / "split")) == (pii_0, split_0)

    edited_sources("tasks.corpus.split", "\nSPLIT_RULE_CHANGED = True\n")  # only the later stage's rule
    run_pii(PiiConfig(), ingest, tmp_path / "pii", workers=1)
    run_split(SplitConfig(validation_fraction=0.25), tmp_path / "pii", tmp_path / "split", workers=1)
    split_1 = stamp(tmp_path / "split")
    assert stamp(tmp_path / "pii") == pii_0 and split_1[0] != split_0[0]

    edited_sources("tasks.filters.pii", "\nPII_RULE_CHANGED = True\n")  # the earlier stage's rule: both recompute
    run_pii(PiiConfig(), ingest, tmp_path / "pii", workers=1)
    run_split(SplitConfig(validation_fraction=0.25), tmp_path / "pii", tmp_path / "split", workers=1)
    assert stamp(tmp_path / "pii")[0] != pii_0[0] and stamp(tmp_path / "split")[0] != split_1[0]


def test_a_later_process_takes_the_trees_from_the_cache_and_gets_the_same_digest(tmp_path: Path, monkeypatch, edited_sources) -> None:
    """Issue 57: parsing every stage's modules cost a run ~1 s before its stages' task runs. A new process (its
    in-memory caches empty) reads the trees of unchanged sources from $XDG_CACHE_HOME/hymo/rule-trees.json; an
    edited source is parsed again and changes the digest as before."""
    import ast

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    parsed: list[int] = []
    real_parse = ast.parse
    monkeypatch.setattr(rules.ast, "parse", lambda source, *a, **k: parsed.append(1) or real_parse(source, *a, **k))

    def new_process() -> None:
        rules.parsed_module.cache_clear()
        rules.rule_digest.cache_clear()
        rules.TREES.clear()
        rules.NEW_TREES.clear()

    new_process()
    first = rules.rule_digest("quality")
    assert parsed and (tmp_path / "hymo" / "rule-trees.json").exists()
    parsed.clear()
    new_process()
    assert rules.rule_digest("quality") == first and not parsed  # no module parsed again

    edited_sources("tasks.filters.c4", "\nEDITED = 1\n")
    new_process()
    assert rules.rule_digest("quality") != first and len(parsed) == 1  # only the edited module

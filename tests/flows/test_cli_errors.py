"""Errors for people: a failed command ends in one line naming the stage, the file and the fix;
the funnel stays readable in an 80-column terminal."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flows import cli
from flows.cli.funnel import print_funnel
from flows.console import console
from flows.pipeline import RUN_CONFIG
from flows.config import PipelineConfig as PipelineConfigForTest
from manifests.run_dir import completed_stages


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_funnel_fits_80_columns_without_cutting_a_rule_name(tiny_run: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(console, "width", 80)
    print_funnel(tiny_run)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for _, manifest in completed_stages(tiny_run):
        ranked = sorted({**manifest.counts.get("removed", {}), **manifest.counts.get("routed", {})}.items(), key=lambda kv: -kv[1])
        for rule, n in ranked[:3]:
            assert f"{rule} {n}" in out  # whole, on one line


def test_funnel_at_80_columns_keeps_the_longest_rule_names_whole(tiny_run: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """The failing case: the sample's longest rule names (up to 42 characters) with six-digit counts, beside its
    longest stage names; a rules column beside the counts cut them at 80 columns."""
    import shutil

    run = tmp_path / "run"
    stage = run / "05_quality_model"
    shutil.copytree(tiny_run / "02_extract", stage)
    manifest = json.loads((stage / "manifest.json").read_text(encoding="utf-8"))
    long_rules = {"max_fineweb_duplicate_line_char_fraction": 123456, "digest_collisions_with_different_text": 98765,
                  "fineweb_too_few_terminal_punct_lines": 54321}
    manifest["stage"] = "quality_model"
    manifest["counts"] = {"in": 1234567, "kept": 958025, "removed": long_rules, "modified": {}}
    (stage / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    monkeypatch.setattr(console, "width", 80)
    print_funnel(run)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for rule, n in long_rules.items():
        assert f"{rule} {n}" in out, out  # whole, on one line
    assert "1234567" in out and "958025" in out


def test_missing_run_directory_is_one_line_with_a_fix(tmp_path: Path, prefect_harness, capsys) -> None:
    code = cli.main(["rerun", str(tmp_path / "nowhere"), "--stage", "split", "--api-url", prefect_harness])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err  # found before the flow starts (flows.preflight)
    line = last_line(err)
    assert line.startswith("hymo: ") and "nowhere" in line and "config.json" in line and "fix:" in line


def test_second_run_on_a_locked_directory_names_the_holder(tmp_path: Path, prefect_harness, capsys) -> None:
    from flows.config import PipelineConfig

    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_CONFIG).write_text(json.dumps({"config": PipelineConfig().model_dump(mode="json"), "runner": "process"}), encoding="utf-8")
    hold = "import sys, time; from manifests.run_lock import run_lock\nwith run_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(300)\n"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code = cli.main(["rerun", str(run), "--stage", "split", "--api-url", prefect_harness])
    finally:
        holder.kill()
        holder.wait()
    line = last_line(capsys.readouterr().err)
    assert code == 2 and f"pid {holder.pid}" in line and "another --out" in line  # before the flow starts (flows.preflight)


def test_debug_shows_the_traceback(tmp_path: Path, prefect_harness) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_CONFIG).write_text(json.dumps({"config": PipelineConfigForTest().model_dump(mode="json"), "runner": "process"}), encoding="utf-8")
    with pytest.raises(Exception, match="split|complete|manifest"):  # the stage before split was never run: raised, not explained
        cli.main(["rerun", str(run), "--stage", "split", "--api-url", prefect_harness, "--debug"])


def test_digest_mismatch_fix_names_the_real_run_and_stage(tmp_path: Path) -> None:
    """The fix line used to print `hymo rerun RUN --stage STAGE --force`, placeholders and all (issue 55)."""
    from conftest import publish_docs

    from flows.errors import explain
    from manifests.stage_manifest import DigestMismatch, read_manifest

    stage = publish_docs(tmp_path / "run" / "01_ingest", {"a": "one document", "b": "another"})
    data = next(p for p in stage.rglob("*.parquet") if "audit" not in p.name)
    data.write_bytes(data.read_bytes() + b"changed")
    with pytest.raises(DigestMismatch) as error:
        read_manifest(stage, verify=True, full=True)
    line = explain(error.value)
    assert f"`hymo rerun {tmp_path / 'run'} --stage ingest --force` recomputes it" in line
    assert "RUN" not in line and "STAGE" not in line


def test_many_bad_files_make_one_whole_line() -> None:
    """Five files named with their reasons, the rest counted, and the fix never cut (it was: `([ingest] — fix:`)."""
    from flows.errors import explain
    from tasks.ingest.ingest import BadInputFiles

    reasons = [f"/data/crawl/{'deep/' * 12}part-{i:05d}.jsonl.zst: unreadable or truncated (zstd stream ended inside a frame: the file is "
               "truncated)" for i in range(7)]
    line = explain(BadInputFiles(reasons))
    assert "\n" not in line and line.startswith("hymo: BadInputFiles: 7 input files cannot be read, nothing was published: ")
    assert all(f"part-{i:05d}.jsonl.zst" in line for i in range(5)) and "part-00005" not in line and "; and 2 more — fix: " in line
    assert line.endswith('set [ingest] on_bad_file = "quarantine" to leave each out with an audit row; then run the same command again '
                         "(--debug shows the traceback)")


def test_a_truncated_zst_stops_hymo_run_naming_it_and_quarantine_lets_it_go_on(tmp_path: Path, prefect_harness: str, capsys) -> None:
    """End to end through the CLI: the file python-zstandard's stream_reader read as complete (issue 55)."""
    import zstandard

    data = tmp_path / "sources" / "crawl"
    data.mkdir(parents=True)
    (data / "a-good.jsonl").write_text("".join(json.dumps({"text": f"a good document number {i} " * 10}) + "\n" for i in range(4)), encoding="utf-8")
    blob = zstandard.ZstdCompressor().compress("".join(json.dumps({"text": f"line {i} " * 30}) + "\n" for i in range(20)).encode())
    (data / "b-cut.jsonl.zst").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "sources" / "crawl.toml").write_text('name = "crawl"\nkind = "jsonl"\npath = "crawl"\norigin = "me"\nsnapshot = "1"\n'
                                                     'license = "cc0"\n', encoding="utf-8")
    config = tmp_path / "pipeline.toml"
    config.write_text('[run]\nsources = ["sources/crawl.toml"]\nworkers = 1\n', encoding="utf-8")
    base = ["run", "--config", str(config), "--until", "ingest", "--api-url", prefect_harness]
    capsys.readouterr()
    assert cli.main([*base, "--out", str(tmp_path / "failed")]) == 1
    line = last_line(capsys.readouterr().err)
    assert line.startswith("hymo: stage ingest failed: BadInputFiles: 1 input file cannot be read, nothing was published: ")
    assert "crawl/b-cut.jsonl.zst: unreadable or truncated (zstd stream ended inside a frame" in line and "a-good" not in line
    assert line.endswith("then run the same command again (--debug shows the traceback)")
    assert sorted(p.name for p in (tmp_path / "failed").iterdir()) == [".lock", "config.json"]  # no stage directory, no failure record
    assert cli.main([*base, "--out", str(tmp_path / "quarantined"), "--set", "ingest.on_bad_file=quarantine"]) == 0
    from manifests.audit_query import quarantined_files

    assert [f["file"] for f in quarantined_files(tmp_path / "quarantined")] == ["b-cut.jsonl.zst"]
    counts = read_manifest_counts(tmp_path / "quarantined" / "01_ingest")
    assert counts["kept"] == 4 and counts["in"] == counts["kept"] + sum(counts["removed"].values())


def read_manifest_counts(stage: Path) -> dict:
    from manifests.stage_manifest import read_manifest

    return read_manifest(stage).counts


def test_a_long_message_is_never_cut_silently() -> None:
    from flows.errors import explain

    message = "schema: " + "column_name: string, " * 60 + "the end"
    line = explain(RuntimeError(message))
    assert "\n" not in line and "the end" not in line
    kept = line.removeprefix("hymo: RuntimeError: ").split(" … (")[0]
    assert message.startswith(kept) and message[len(kept)] == " "  # cut between words, not inside one
    assert f" … ({len(message) - len(kept)} more characters; --debug shows the traceback) — fix: " in line

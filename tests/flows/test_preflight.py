"""Errors before anything starts (flows.preflight): a bad config, source, path, lock or checkpoint ends the
command in the CLI process with one line, before Prefect (or torch) is imported, having written nothing.

Counted, not timed: each case runs `hymo` in a fresh interpreter, and after `main` returns that interpreter
reports whether `prefect` / `torch` were ever imported; the directory tree it ran in is compared before and after.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from manifests.stage_manifest import read_manifest

REPO = Path(__file__).resolve().parents[2]
PROBE = ("import json, sys\nfrom flows.cli import main\ncode = main(sys.argv[1:])\n"
         "print(json.dumps({'code': code, 'prefect': any(m.split('.')[0] == 'prefect' for m in sys.modules), "
         "'torch': any(m.split('.')[0] == 'torch' for m in sys.modules)}))\n")


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def hymo_probe(args: list[str], cwd: Path) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYMO_HOME": str(cwd / "home")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr.strip()


def fails_early(args: list[str], cwd: Path, torch_free: bool = True) -> str:
    """Run `hymo ARGS` in `cwd`; assert it failed with one line, imported no Prefect (nor torch), wrote nothing. The line."""
    before = tree(cwd)
    result, err = hymo_probe(args, cwd)
    assert result["code"] == 2, err
    assert not result["prefect"], f"Prefect was imported before the error: {err}"
    if torch_free:
        assert not result["torch"], f"torch was imported before the error: {err}"
    assert tree(cwd) == before  # no config.json, no cache folder, no .hymo, no home
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hymo: ") and " — fix: " in lines[0], err
    return lines[0]


def spec(target: Path, **values: str) -> Path:
    fields = {"name": "mine", "kind": "jsonl", "path": "data", "origin": "me", "snapshot": "2024", "license": "cc0", **values}
    target.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items()), encoding="utf-8")
    return target


def test_config_typo_names_the_file_the_key_and_the_nearest_key(tmp_path: Path) -> None:
    (tmp_path / "pipeline.toml").write_text('[run]\nsources = ["python-docs"]\n[quality]\nmin_wrds = 3\n', encoding="utf-8")
    line = fails_early(["run", "--config", "pipeline.toml", "--out", "run"], tmp_path)
    assert "pipeline.toml" in line and "[quality]" in line and "'min_wrds'" in line and "did you mean 'min_words'" in line


def test_set_override_typo_and_bad_value(tmp_path: Path) -> None:
    line = fails_early(["run", "--set", "pretrain.train.max_stps=3", "--out", "run"], tmp_path)
    assert "--set pretrain.train.max_stps=3" in line and "did you mean 'max_steps'" in line
    line = fails_early(["run", "--set", "run.workers=0", "--out", "run"], tmp_path)
    assert "workers" in line and "got 0" in line


def test_source_glob_that_matches_nothing_and_a_missing_source_path(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("not jsonl\n", encoding="utf-8")
    spec(tmp_path / "mine.toml")
    (tmp_path / "pipeline.toml").write_text('[run]\nsources = ["mine.toml"]\n', encoding="utf-8")
    line = fails_early(["run", "--config", "pipeline.toml", "--out", "run"], tmp_path)
    assert "source mine" in line and str(tmp_path / "data") in line and "'**/*.jsonl*'" in line and "matches" in line
    spec(tmp_path / "mine.toml", path="elsewhere")
    line = fails_early(["run", "--config", "pipeline.toml", "--out", "run"], tmp_path)
    assert "source mine" in line and "elsewhere" in line and "does not exist" in line


def test_bad_source_spec_and_unknown_stage(tmp_path: Path) -> None:
    spec(tmp_path / "mine.toml", kind="csv")
    (tmp_path / "pipeline.toml").write_text('[run]\nsources = ["mine.toml"]\n', encoding="utf-8")
    line = fails_early(["run", "--config", "pipeline.toml", "--out", "run"], tmp_path)
    assert "mine.toml" in line and "'csv'" in line
    line = fails_early(["run", "--until", "shardz", "--out", "run"], tmp_path)
    assert "--until shardz" in line and "did you mean 'shards'" in line


def test_url_run_directory_is_refused(tmp_path: Path) -> None:
    line = fails_early(["run", "--out", "s3://bucket/x"], tmp_path)
    assert "--out s3://bucket/x" in line and "not a URL" in line
    assert not (tmp_path / "s3:").exists()


def test_locked_run_directory_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    hold = "import sys, time; from manifests.run_lock import run_lock\nwith run_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(300)\n"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = fails_early(["run", "--out", "run"], tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert f"pid {holder.pid}" in line and "another --out" in line


def test_rerun_of_a_stage_the_run_does_not_have(tmp_path: Path) -> None:
    from flows.config import PipelineConfig

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": PipelineConfig().model_dump(mode="json"), "runner": "process"}), encoding="utf-8")
    line = fails_early(["rerun", "run", "--stage", "quality_modle"], tmp_path)
    assert "--stage quality_modle" in line and "did you mean" in line


def test_missing_checkpoint_is_missing_before_torch(tmp_path: Path) -> None:
    line = fails_early(["eval", "gone.pt", "--corpus", "corpus"], tmp_path)
    assert "gone.pt: checkpoint missing" in line and "corrupt" not in line
    line = fails_early(["cpt", "run", "gone.pt", "--domain", "d", "--general", "g", "--out", "o"], tmp_path)
    assert "gone.pt: checkpoint missing" in line


def test_training_recipe_typo_before_torch(tmp_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "recipe.toml").write_text("[train]\nmax_step = 10\n", encoding="utf-8")
    line = fails_early(["train", "--corpus", "corpus", "--out", "out", "--config", "recipe.toml"], tmp_path)
    assert "recipe.toml" in line and "[train] has no key 'max_step'" in line and "did you mean 'max_steps'" in line
    line = fails_early(["train", "--corpus", "corpus", "--out", "out", "--set", "train.batch_size=0"], tmp_path)
    assert "batch_size" in line


def test_checkpoint_errors_never_repeat_torchs_weights_only_advice(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from hymo_core.checkpoint.common import CheckpointError
    from hymo_core.checkpoint.single import read_checkpoint

    torch.save({"model": Path("x")}, tmp_path / "foreign.pt")  # a pickled object a weights-only load refuses
    with pytest.raises(CheckpointError) as caught:
        read_checkpoint(tmp_path / "foreign.pt")
    assert "weights_only" not in str(caught.value) and "not a HyMo checkpoint" in str(caught.value)
    with pytest.raises(CheckpointError) as caught:
        read_checkpoint(tmp_path / "gone.pt")
    assert "missing" in str(caught.value) and "corrupt" not in str(caught.value)


def test_two_sources_with_one_name_are_refused_naming_both_spec_files(tmp_path: Path) -> None:
    """A spec copied from another that kept `name = "forum"` would never be read (issue 55)."""
    for folder in ("one", "two"):
        (tmp_path / folder / "data").mkdir(parents=True)
        (tmp_path / folder / "data" / "f.jsonl").write_text('{"text": "x"}\n', encoding="utf-8")
        spec(tmp_path / folder / "forum.toml", name="forum", license="cc0" if folder == "one" else "cc-by")
    (tmp_path / "pipeline.toml").write_text('[run]\nsources = ["one/forum.toml", "two/forum.toml"]\n', encoding="utf-8")
    line = fails_early(["run", "--config", "pipeline.toml", "--out", "run"], tmp_path)
    assert "two sources are named 'forum'" in line
    assert str(tmp_path / "one" / "forum.toml") in line and str(tmp_path / "two" / "forum.toml") in line


def test_url_run_directory_refusal_points_to_the_storage_section(tmp_path: Path) -> None:
    line = fails_early(["run", "--out", "s3://bucket/x"], tmp_path)
    fix = line.split(" — fix: ", 1)[1]
    assert "docs/your-data.md" in fix and "What the run directory's storage must support" in fix
    assert "mount the bucket" not in fix and "s3fs" not in fix and "gcsfuse" not in fix


def test_two_runs_started_at_once_on_one_directory(tmp_path: Path, prefect_harness: str) -> None:
    """Exactly one runs; the other is refused by the pre-flight (exit 2, Prefect never imported), and the run
    directory holds the files of one run. Counted, not timed: the refused one never started Prefect, so the
    lock was taken before either could start it (issue 55: a second run used to pass a probe of the lock
    during the first one's Prefect start-up, then start its own flow and fail 22 s later)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(5)), encoding="utf-8")
    spec(tmp_path / "mine.toml")
    (tmp_path / "pipeline.toml").write_text('[run]\nsources = ["mine.toml"]\nworkers = 1\n', encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYMO_HOME": str(tmp_path / "home")}
    args = ["run", "--config", "pipeline.toml", "--out", "run", "--until", "ingest", "--api-url", prefect_harness]
    runs = [subprocess.Popen([sys.executable, "-c", PROBE, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sorted(r["code"] for r in results) == [0, 2], outputs
    winner, loser = (0, 1) if results[0]["code"] == 0 else (1, 0)
    assert results[winner]["prefect"] and not results[loser]["prefect"]  # refused before Prefect was imported
    refusal = outputs[loser][1].strip().splitlines()
    assert len(refusal) == 1 and refusal[0].startswith("hymo: ") and f"in use by pid {runs[winner].pid} " in refusal[0]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".funnel.key", ".lock", ".report.key", "01_ingest", "config.json", "funnel.png", "report.html"]  # one run's, no work dir
    assert read_manifest(tmp_path / "run" / "01_ingest").counts["kept"] == 5


def test_a_run_refused_after_the_preflight_leaves_no_directory(tmp_path: Path) -> None:
    """The pre-flight makes the run directory to lock it; a command that then fails before writing anything (here:
    a remote Prefect API that does not answer) removes it again, so a refused run still writes nothing."""
    result, err = hymo_probe(["run", "--out", "run", "--api-url", "http://prefect.invalid:9/api"], tmp_path)
    assert result["code"] == 1 and "does not answer" in err.splitlines()[-1]
    assert not (tmp_path / "run").exists()

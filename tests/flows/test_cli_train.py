"""`hymo train`, `hymo eval` and `hymo generate` on a tiny run, and `python -m hymo_core.train` without Prefect."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flows.cli import main
from tests.conftest import tiny_recipe

RECIPE = tiny_recipe()


@pytest.fixture(scope="module")
def trained(tiny_run: Path, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    (root / "recipe.toml").write_text(RECIPE)
    assert main(["train", "--corpus", str(tiny_run), "--config", str(root / "recipe.toml"), "--out", str(root / "out")]) == 0
    return root / "out"


def test_train_writes_summary_metrics_picture_checkpoint(trained: Path, tiny_run: Path, capsys):
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["final_step"] == 3 and summary["final_val_loss"] < summary["ln_vocab"] + 1
    assert (trained / "loss.png").stat().st_size > 1000 and (trained / "checkpoints" / "step-00000003.pt").is_file()
    record = json.loads((trained / "metrics.jsonl").read_text().splitlines()[0])
    assert {"loss", "grad_norm_pre_clip", "lr", "tokens_per_s", "mfu", "clip_fraction", "update_rms_ratio", "skipped_updates", "max_attention_logit"} <= set(record)
    # a second plain `train` into the same directory would silently discard the checkpoints: refused, in one line
    capsys.readouterr()
    assert main(["train", "--corpus", str(tiny_run), "--out", str(trained)]) == 2  # refused: hymo_core.exit_codes
    err = capsys.readouterr().err
    assert "FileExistsError" in err and "--resume" in err
    with pytest.raises(FileExistsError, match="--resume"):
        main(["train", "--corpus", str(tiny_run), "--out", str(trained), "--debug"])


def test_eval_prints_loss_perplexity_and_cloze(trained: Path, tiny_run: Path, capsys):
    checkpoint = str(trained / "checkpoints" / "step-00000003.pt")
    assert main(["eval", checkpoint, "--corpus", str(tiny_run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 3 and result["same_corpus"] and result["cloze"]["items"] == 40
    assert result["val_perplexity"] == pytest.approx(2.718281828 ** result["val_loss"], rel=1e-6)
    assert main(["eval", checkpoint, "--corpus", str(tiny_run)]) == 0
    text = capsys.readouterr().out
    assert "validation loss" in text and "perplexity" in text and "cloze accuracy" in text


def test_generate_continues_the_prompt(trained: Path, tiny_run: Path, capsys):
    checkpoint = str(trained / "checkpoints" / "step-00000003.pt")
    assert main(["generate", checkpoint, "--corpus", str(tiny_run), "--prompt", "The river", "--max-new-tokens", "8"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("The river") and len(first.strip()) > len("The river")
    main(["generate", checkpoint, "--corpus", str(tiny_run), "--prompt", "The river", "--max-new-tokens", "8"])
    assert capsys.readouterr().out == first  # seeded sampling


def test_hymo_train_flow_returns_the_summary(tiny_run: Path, tmp_path: Path, prefect_harness):
    from flows.train_flow import hymo_train

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    summary = hymo_train(corpus=str(tiny_run), config=str(recipe), out=str(tmp_path / "out"), max_steps=2)
    assert summary["final_step"] == 2 and (tmp_path / "out" / "summary.json").is_file()
    again = hymo_train(corpus=str(tiny_run), config=str(recipe), out=str(tmp_path / "out"), max_steps=2)  # resume=True: nothing left to do
    assert again["weights_sha256"] == summary["weights_sha256"] and again["resumed_from"].endswith("step-00000002.pt")


def test_max_steps_stops_early_without_moving_the_schedule(tiny_run: Path, tmp_path: Path, capsys):
    """--max-steps below warmup trains; a resume with more steps is accepted; --horizon moves the decay; one-line errors."""
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.replace("max_steps = 3", "max_steps = 8").replace("warmup_steps = 1", "warmup_steps = 5"))
    out = tmp_path / "out"
    common = ["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out)]
    assert main(common + ["--max-steps", "2"]) == 0
    assert main(common + ["--max-steps", "4", "--resume"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lrs = [max(r["lr"].values()) for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]
    assert lrs == pytest.approx([4e-3 * step / 5 for step in (1, 2, 3, 4)])  # still warming up towards step 5 of 8
    capsys.readouterr()
    assert main(common + ["--max-steps", "6", "--horizon", "20", "--resume"]) == 2  # another schedule: refused
    error = capsys.readouterr().err.strip()
    assert "LR schedule differs" in error and "\n" not in error and "Traceback" not in error
    assert main(common + ["--horizon", "3"]) == 2  # a horizon inside the warmup
    assert "horizon_steps must exceed warmup_steps" in capsys.readouterr().err


def test_train_nproc_2_under_torchrun_then_eval_the_dcp_checkpoint(trained: Path, tiny_run: Path, tmp_path: Path, capsys):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    out = tmp_path / "out"
    assert main(["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out), "--nproc", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["final_step"] == 3
    printed = capsys.readouterr().out
    assert "step 3: train loss" in printed
    progress = [line for line in printed.splitlines() if line.startswith("step ") and "tokens/s" in line]
    assert [line.split()[1] for line in progress] == ["1/3", "2/3", "3/3"]  # rank 0: one line per logged step
    assert {p.name for p in (out / "logs").iterdir()} >= {"rank-0.log", "rank-1.log"}
    assert "step 3/3" in (out / "logs" / "rank-0.log").read_text()
    # Validation batches and cloze pairs split over the ranks, then reduced: the one-process numbers.
    alone = json.loads((trained / "summary.json").read_text())
    assert summary["final_val_loss"] == pytest.approx(alone["final_val_loss"], rel=1e-5)
    assert summary["cloze"]["items"] == alone["cloze"]["items"] > 1
    for key in ("accuracy", "accuracy_length_normalised", "boundary_merged"):
        assert summary["cloze"][key] == alone["cloze"][key], key
    checkpoint = out / "checkpoints" / "step-00000003"
    assert (checkpoint / "metadata.json").is_file()
    corpus = json.loads((tiny_run / "07_shards" / "corpus.json").read_text())  # DCP checkpoints name their tokenizer too
    assert json.loads((checkpoint / "metadata.json").read_text())["tokenizer_sha256"] == corpus["tokenizer"]["sha256"]
    assert main(["eval", str(checkpoint), "--corpus", str(tiny_run), "--json", "--batches", "2"]) == 0  # --batches = the recipe's eval_batches: the windows training validated on
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 3 and result["val_loss"] == pytest.approx(summary["final_val_loss"], rel=1e-5)


def test_train_nproc_refuses_a_batch_that_does_not_split_before_starting_torchrun(tiny_run: Path, tmp_path: Path, capsys):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)  # 4 windows per update
    out = tmp_path / "out"
    assert main(["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out), "--nproc", "3"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == "error: global batch 4 x 1 = 4 windows does not split over 3 ranks"
    assert not (out / "logs").exists()  # no rank was started


def test_train_nproc_names_the_rank_and_its_first_error_line(tiny_run: Path, tmp_path: Path, capsys):
    """A damaged shard: rank 0 checks the digests for all ranks; the CLI prints one line naming a rank, exit 2."""
    import shutil

    manifest_path = next(tiny_run.glob("*_shards/corpus.json"))
    corpus = tmp_path / "corpus"
    shutil.copytree(manifest_path.parent, corpus)
    manifest = json.loads((corpus / "corpus.json").read_text())
    shard = corpus / manifest["shards"]["train"][0]["path"]
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    out = tmp_path / "out"
    assert main(["train", "--corpus", str(corpus), "--config", str(recipe), "--out", str(out), "--nproc", "2"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "Traceback" not in error and "torchrun" not in error
    assert error.startswith("error: rank ") and f"{shard.name}: sha256" in error and "logs/rank-" in error
    rank = int(error.split()[2].rstrip(":"))
    assert f"{shard.name}: sha256" in (out / "logs" / f"rank-{rank}.log").read_text()


def test_eval_suite_with_limit_prints_the_table_and_writes_eval_json(trained: Path, tiny_run: Path, tmp_path: Path, capsys, monkeypatch):
    """`hymo eval CKPT --suite default --limit 10`, offline, on a checkpoint inside its run directory (corpus found by digest);
    GSM8K / HumanEval decoded 4 prompts at a time.
    (bench/eval_suite.py times the README's --limit 50 on the sample checkpoint.)"""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "07_shards").symlink_to(tiny_run / "07_shards")
    checkpoint = run / "checkpoints" / "step-00000003.pt"
    checkpoint.write_bytes((trained / "checkpoints" / "step-00000003.pt").read_bytes())
    for name in ("HYMO_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # restored after the test: the policy exports its choice
        monkeypatch.delenv(name, raising=False)
    import torch

    threads_before = torch.get_num_threads()
    assert main(["eval", str(checkpoint), "--suite", "default", "--limit", "10", "--generation-batch-size", "4", "--threads", "1"]) == 0
    # the suite's choice lasts the suite: an eval inside a longer-lived process must not become the next run's HYMO_THREADS
    assert not {"HYMO_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"} & set(os.environ) and torch.get_num_threads() == threads_before
    table = capsys.readouterr().out
    for task in ("hellaswag", "arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval", "held-out (validation)"):
        assert f"| {task} |" in table, task
    result = json.loads((run / "eval" / "step-00000003" / "eval.json").read_text())
    tasks = result["tasks"]
    assert result["same_corpus"] and [tasks[t]["items"] for t in ("hellaswag", "arc_easy", "arc_challenge", "gsm8k", "humaneval")] == [10] * 5
    assert tasks["mmlu"]["items"] == 57 * 10 and len(tasks["mmlu"]["subjects"]) == 57
    assert tasks["mmlu"]["chance"] == 0.25 and 0 <= tasks["hellaswag"]["accuracy"] <= 1
    assert result["sandbox"] == tasks["humaneval"]["sandbox"] == "namespaces" and all(r["status"] in ("passed", "failed", "timeout") for r in tasks["humaneval"]["per_item"])
    assert result["perplexity"]["perplexity"] == pytest.approx(2.718281828 ** result["perplexity"]["loss"], rel=1e-6)
    held_out = result["perplexity"]
    assert 0 < held_out["bytes"] and held_out["bits_per_byte"] == pytest.approx(held_out["loss"] * held_out["tokens"] / (0.6931471805599453 * held_out["bytes"]))
    assert result["complete"] and result["num_fewshot"] == 0
    assert result["threads"]["threads"] == 1 and result["threads"]["source"] == "--threads" and result["threads"]["cpus"] >= 1
    assert tasks["arc_challenge"]["labels"]["accuracy_per_char"].startswith("lm-eval acc_norm") and "accuracy_uncond" in tasks["arc_challenge"]
    assert "0-shot" in tasks["arc_easy"]["convention"] and all("contexts_truncated" in tasks[t] for t in tasks)
    # deterministic: a second run over the same items gives the same per-item scores
    again = json.loads(json.dumps(result))
    monkeypatch.setenv("HYMO_THREADS", "2")
    assert main(["eval", str(checkpoint), "--suite", "mc", "--limit", "5", "--out", str(tmp_path / "again")]) == 0
    second = json.loads((tmp_path / "again" / "eval.json").read_text())
    assert second["threads"]["threads"] == 2 and second["threads"]["source"] == "HYMO_THREADS"  # and the same scores below
    assert [r["logprobs"] for r in second["tasks"]["hellaswag"]["per_item"]] == [r["logprobs"] for r in again["tasks"]["hellaswag"]["per_item"][:5]]


def test_eval_json_is_written_after_every_task_and_few_shot_prompts_are_recorded(trained: Path, tiny_run: Path, tmp_path: Path):
    from hymo_core.eval.report import run_suite

    checkpoint = trained / "checkpoints" / "step-00000003.pt"

    def stop_after_first_task(line: str) -> None:
        if line.startswith("hellaswag:"):
            raise KeyboardInterrupt  # a kill after the first task
    with pytest.raises(KeyboardInterrupt):
        run_suite(checkpoint, "mc", corpus=tiny_run, limit=2, out=tmp_path / "killed", log=stop_after_first_task)
    partial = json.loads((tmp_path / "killed" / "eval.json").read_text())
    assert list(partial["tasks"]) == ["hellaswag"] and partial["complete"] is False
    assert partial["tasks"]["hellaswag"]["accuracy_stderr"] is not None  # n = 2: lm-eval's (n - 1) error exists
    assert main(["eval", str(checkpoint), "--corpus", str(tiny_run), "--suite", "mc", "--limit", "1", "--num-fewshot", "2",
                 "--out", str(tmp_path / "shots")]) == 0
    shots = json.loads((tmp_path / "shots" / "eval.json").read_text())
    arc = shots["tasks"]["arc_easy"]
    assert shots["num_fewshot"] == arc["num_fewshot"] == 2 and "2-shot from OLMES's curated train-split shots (seed 1234" in arc["convention"]
    assert any("fewshot/arc_easy" in path for path in arc["files"]) and arc["accuracy_stderr"] is None  # n = 1: no (n - 1) error
    assert arc["accuracy_wilson95"][1] > 0.7  # the Wilson interval of one item is wide, not zero


def test_hymo_cpt_end_to_end_with_a_task_gate(trained: Path, tiny_run: Path, tmp_path: Path, capsys, prefect_harness):
    """`hymo retokenize` gives a domain corpus in the base's ids; `hymo cpt` continues, judges and records lineage; so does the flow."""
    checkpoint = str(trained / "checkpoints" / "step-00000003.pt")
    assert main(["retokenize", str(tiny_run), "--tokenizer-from", str(tiny_run), "--out", str(tmp_path / "domain")]) == 0
    status = main(["cpt", "run", checkpoint, "--domain", str(tmp_path / "domain"), "--general", str(tiny_run), "--out", str(tmp_path / "cpt"),
                   "--steps", "4", "--warmup", "1", "--eval-interval", "2", "--eval-batches", "2", "--task", "arc_easy", "--paired-items", "30"])
    summary = json.loads((tmp_path / "cpt" / "summary.json").read_text())
    assert status == (0 if summary["verdict"]["passed"] else 4)  # hymo_core.exit_codes: a failed verdict is 4
    assert [row["metric"] for row in summary["verdict"]["criteria"]] == ["domain_loss_reduction", "general_loss_rise", "task_accuracy_drop:arc_easy"]
    assert summary["verdict"]["criteria"][2]["n"] == 30 and 'task = "arc_easy"' in (tmp_path / "cpt" / "gate.toml").read_text()
    assert summary["lineage"]["base_checkpoint"].endswith("step-00000003.pt") and Path(summary["lineage"]["cpt_checkpoint"]).is_file()
    assert "verdict:" in capsys.readouterr().out
    assert main(["cpt", "verify", str(tmp_path / "cpt")]) == 0  # the ledger beside OUT, both checkpoints re-measured
    assert "recomputed verdict" in capsys.readouterr().out

    from flows.cpt_flow import hymo_cpt
    from flows.serve import DEPLOYMENTS

    flow_summary = hymo_cpt(base=checkpoint, domain=str(tmp_path / "domain"), general=str(tiny_run), out=str(tmp_path / "flow"), steps=2,
                            warmup_steps=1, eval_interval=2, eval_batches=2)
    assert flow_summary["lineage"]["cpt_run"] == str(tmp_path / "flow") and "hymo-cpt/cpt" in DEPLOYMENTS
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:  # the hashes also live in the Prefect server, outside OUT
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["hymo-cpt-start", "hymo-cpt-end"])))
    ends = [a for a in artifacts if a.key == "hymo-cpt-end" and str(tmp_path / "flow") in (a.description or "")]
    assert ends and flow_summary["measurements"]["sha256"] in json.dumps(ends[-1].data)
    assert main(["cpt", "verify", str(tmp_path / "flow")]) == 0  # the ledger's records equal the artifacts'
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "ok prefect artifacts: ledger start/end records against the Prefect artifacts: equal (1 end, 1 start)" in printed


def test_hymo_serve_offers_the_cpt_deployment(served):
    import time

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + 120  # `served` waits for the first deployment; the others register right after
    with get_client(sync_client=True) as client:
        while True:
            try:
                deployment = client.read_deployment_by_name("hymo-cpt/cpt")
                break
            except ObjectNotFound:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
    assert deployment.parameters["general"].endswith("sample") and "gate" in deployment.description

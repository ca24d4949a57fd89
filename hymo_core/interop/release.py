"""`hymo release RUN --out DIR`: what seed 001 lists for a base-model release, from one run directory.

    DIR/model/            `hymo export --hf` of the pretrain stage's final checkpoint (hf_export), and
                          logit_check.json: the largest |logit| difference between transformers on the
                          export and HyMo on the checkpoint, over the run's held-out windows
    DIR/training/         metrics.jsonl, loss.png (+ expert_load.png), summary.json of the pretrain stage
    DIR/data/             corpus.json (sources, licences, filters per source, mixture, token counts, shard
                          digests) and funnel.json (every stage: in, kept, removed and modified per rule)
    DIR/decontamination/  record.json (benchmarks and their file digests, n-gram size, caps, removals per
                          benchmark), removal_list.parquet (each removed document, its item and n-gram)
    DIR/eval/             the suite on every kept checkpoint (STEP/eval.json, eval.md), curve.json, curve.png
    DIR/README.md         the model card; DIR/DATA_CARD.md the data card (cards.py: numbers from the files above)
    DIR/SHA256SUMS        `sha256sum -c` format, every other file of the bundle

The bundle is assembled beside DIR and renamed into place: a failed release leaves nothing half-made.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from hymo_core.interop.atomic_dir import new_directory
from hymo_core.interop.cards import Facts, data_card, model_card
from hymo_core.interop.hf_export import export_hf
from hymo_core.train.config import EXPERT_LOAD_PICTURE, LOSS_PICTURE, METRICS_FILE, SUMMARY_FILE
from manifests.audit_query import funnel
from manifests.digest import sha256_file
from manifests.run_dir import find_stage

SUMS_FILE = "SHA256SUMS"
STEP_RE = re.compile(r"step-(\d+)")


def _write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")



def copy_training(pretrain: Path, out: Path) -> None:
    out.mkdir(parents=True)
    for name in (METRICS_FILE, SUMMARY_FILE, LOSS_PICTURE, EXPERT_LOAD_PICTURE):
        if (pretrain / name).is_file():
            shutil.copyfile(pretrain / name, out / name)


def decontamination_record(run: Path, out: Path) -> None:
    """record.json from the decontam stage's manifest and count table; its removal list copied beside it."""
    out.mkdir(parents=True)
    try:
        stage, manifest = find_stage(run, "decontam")
    except KeyError:
        _write_json(out / "record.json", {"ran": False})
        return
    counts = json.loads((stage.path / "benchmark_counts.json").read_text(encoding="utf-8"))
    shutil.copyfile(stage.path / "removal_list.parquet", out / "removal_list.parquet")
    config = manifest.config
    _write_json(out / "record.json", {
        "ran": True, "stage": stage.path.name, "config_hash": manifest.config_hash,
        "benchmarks": list(config["benchmarks"]), "ngram_size": config["ngram_size"],
        "max_benchmark_items_per_ngram": config["max_benchmark_items_per_ngram"],
        "max_training_docs_per_ngram": config["max_training_docs_per_ngram"],
        "min_matching_ngrams": config["min_matching_ngrams"],
        "documents_in": manifest.counts.get("in", 0), "documents_removed": sum(manifest.counts.get("removed", {}).values()),
        "per_benchmark": counts, "removal_list": "removal_list.parquet",
    })


HEADLINE_METRICS = ("accuracy_per_char", "exact_match_flexible", "pass_at_1")  # multiple choice, GSM8K, HumanEval


def _headline(task: dict[str, Any]) -> tuple[str, float, float]:
    """(metric, value, standard error) a curve shows for one task of a suite result."""
    metric = next(m for m in HEADLINE_METRICS if m in task)
    return metric, task[metric], task[f"{metric}_stderr"]


def eval_curve(pretrain: Path, corpus: Path, out: Path, suite: str, limit: int | None) -> None:
    """The suite on every kept checkpoint (in step order), one point per checkpoint; validation loss from metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hymo_core.eval.report import run_suite

    checkpoints = sorted((p for p in (pretrain / "checkpoints").iterdir() if STEP_RE.search(p.name)),
                         key=lambda p: int(STEP_RE.search(p.name).group(1)))
    points = []
    for checkpoint in checkpoints:
        result = run_suite(checkpoint, suite, corpus, limit, out / checkpoint.stem, log=lambda line: None)
        tasks = {}
        for name, task in result["tasks"].items():
            metric, value, stderr = _headline(task)
            tasks[name] = {"metric": metric, "value": value, "stderr": stderr, "items": task["items"], "convention": task["convention"],
                           "chance": task["chance"], "contexts_truncated": task.get("contexts_truncated", 0)}
        held_out = result.get("perplexity") or {}
        points.append({"step": result["step"], "checkpoint": checkpoint.name, "tasks": tasks,
                       "held_out_loss": held_out.get("loss"), "eval": f"{checkpoint.stem}/eval.json"})
    rows = [json.loads(line) for line in (pretrain / METRICS_FILE).read_text(encoding="utf-8").splitlines() if line.strip()]
    validation = [{"step": r["step"], "val_loss": r["val_loss"]} for r in rows if r.get("kind") == "eval"]
    _write_json(out / "curve.json", {"suite": suite, "limit": limit, "checkpoints": points, "validation_loss": validation})
    figure, (tasks_axis, loss_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for name in (points[0]["tasks"] if points else {}):
        tasks_axis.plot([p["step"] for p in points], [p["tasks"][name]["value"] for p in points], marker="o", label=name)
    tasks_axis.set_xlabel("step")
    tasks_axis.set_ylabel("headline metric")
    tasks_axis.legend(fontsize=7)
    loss_axis.plot([v["step"] for v in validation], [v["val_loss"] for v in validation], marker=".")
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("validation loss")
    figure.tight_layout()
    figure.savefig(out / "curve.png", dpi=100, metadata={"Software": None})
    plt.close(figure)


LOGIT_CHECK_FILE = "logit_check.json"
LOGIT_CHECK_WINDOWS = 4


def logit_check(checkpoint: Path, export: Path, corpus: Path) -> dict[str, Any]:
    """The largest |logit| difference between transformers running the export and HyMo running the checkpoint, over
    the first held-out windows of the run (fp32); {"checked": false, ...} where transformers is not installed."""
    try:
        import transformers
    except ImportError:
        return {"checked": False, "reason": "transformers is not installed (pip install 'hymo[interop]')"}
    import torch

    from hymo_core.checkpoint.load import load_model
    from hymo_core.eval.heldout import HeldOutSet
    from hymo_core.train.data import CorpusReader

    model, payload = load_model(checkpoint)
    record = json.loads((export / "hymo_export.json").read_text(encoding="utf-8"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(export, trust_remote_code=record["trust_remote_code"], dtype=torch.float32).eval()
    seq_len = payload["train_config"]["seq_len"]
    held = HeldOutSet.from_corpus(CorpusReader(corpus), seq_len, LOGIT_CHECK_WINDOWS, max_batches=1)
    x_BT, _, _ = held.batch(0)
    with torch.no_grad():
        difference = (hf(x_BT).logits - model(x_BT)[0]).abs().max().item()
    return {"checked": True, "max_abs_logit_difference": difference, "windows": int(x_BT.shape[0]), "tokens": int(x_BT.numel()),
            "dtype": "float32", "checkpoint": checkpoint.name, "transformers_version": transformers.__version__}


def write_sums(bundle: Path) -> int:
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != SUMS_FILE)
    lines = [f"{sha256_file(p)}  {p.relative_to(bundle).as_posix()}" for p in files]
    (bundle / SUMS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(files)


def make_release(run: str | Path, out: str | Path, eval_limit: int | None = 100, suite: str = "mc") -> dict[str, Any]:
    """Assemble the bundle for `run` into `out` (absent or empty); returns what was written."""
    run, out = Path(run).resolve(), Path(out)
    pretrain, _ = find_stage(run, "pretrain")
    shards, _ = find_stage(run, "shards")
    summary = json.loads((pretrain.path / SUMMARY_FILE).read_text(encoding="utf-8"))
    with new_directory(out, "release") as work:
        export_hf(pretrain.path / summary["checkpoint"], work / "model", corpus=shards.path)
        _write_json(work / "model" / LOGIT_CHECK_FILE, logit_check(pretrain.path / summary["checkpoint"], work / "model", shards.path))
        copy_training(pretrain.path, work / "training")
        (work / "data").mkdir()
        shutil.copyfile(shards.path / "corpus.json", work / "data" / "corpus.json")
        _write_json(work / "data" / "funnel.json", [{k: v for k, v in row.items() if k != "wall_time_s"} for row in funnel(run)])
        decontamination_record(run, work / "decontamination")
        eval_curve(pretrain.path, shards.path, work / "eval", suite, eval_limit)
        facts = Facts(work)
        (work / "README.md").write_text(model_card(facts), encoding="utf-8")
        (work / "DATA_CARD.md").write_text(data_card(facts), encoding="utf-8")
        facts.write()
        files = write_sums(work)
    return {"out": str(out), "files": files, "checkpoint": summary["checkpoint"]}
